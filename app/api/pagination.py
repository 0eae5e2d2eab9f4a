"""Cursor pagination shared by every list endpoint."""

from __future__ import annotations

from typing import Any, TypeVar

from sqlalchemy.ext.asyncio import AsyncSession
from sqlmodel.sql.expression import SelectOfScalar

from app.core.pages import Page

P = TypeVar("P", bound=Page[Any])


async def paginate(
    session: AsyncSession, query: SelectOfScalar[Any], limit: int, page: type[P]
) -> P:
    """One page of `query` (ordered by id, in the page's direction); `next_cursor` is the
    last row's id when more rows follow, to be passed back as `after`."""
    rows = list((await session.execute(query.limit(limit + 1))).scalars())
    more = len(rows) > limit
    rows = rows[:limit]
    return page.model_validate(
        {"data": rows, "next_cursor": rows[-1].id if more else None}, from_attributes=True
    )
