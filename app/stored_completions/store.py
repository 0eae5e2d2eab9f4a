"""The team's stored completions and their feedback in the database: kept within the
team's quota, read one by one or a page at a time by the list door's filters (or a
dataset's), their metadata replaced, deleted (their feedback with them)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, delete, exists, func, select
from sqlalchemy.ext.asyncio import AsyncSession

from app.core.pages import Order
from app.stored_completions.errors import StoredCompletionNotFound, StoredQuotaExceeded
from app.stored_completions.schemas import FeedbackCreate
from app.stored_completions.tables import Feedback, StoredCompletion
from kernel.spec.data import StoredCompletionFilter


async def check_room(session: AsyncSession, team_id: int, quota: int, adding: int = 1) -> None:
    """StoredQuotaExceeded unless the team may keep `adding` more (checked before a
    request samples, so a refused request costs nothing)."""
    query = select(func.count()).where(StoredCompletion.team_id == team_id)
    if (await session.execute(query)).scalar_one() + adding > quota:
        raise StoredQuotaExceeded(quota)


async def add_completions(session: AsyncSession, rows: Sequence[StoredCompletion]) -> None:
    session.add_all(rows)
    await session.commit()


async def get_completion(session: AsyncSession, team_id: int, public_id: str) -> StoredCompletion:
    """The team's stored completion; StoredCompletionNotFound for an id that names none of
    its own (another team's reads the same)."""
    row = (
        await session.execute(
            select(StoredCompletion).where(
                StoredCompletion.public_id == public_id, StoredCompletion.team_id == team_id
            )
        )
    ).scalar_one_or_none()
    if row is None:
        raise StoredCompletionNotFound(public_id)
    return row


def matching(team_id: int, wanted: StoredCompletionFilter) -> list[ColumnElement[bool]]:
    """The conditions of a filter on the team's stored chat completions."""
    labels: Any = StoredCompletion.metadata_
    rated = select(Feedback.id).where(Feedback.completion_id == StoredCompletion.id)
    clauses: list[ColumnElement[bool]] = [StoredCompletion.team_id == team_id]
    if wanted.model is not None:
        clauses.append(StoredCompletion.model == wanted.model)
    for key, value in wanted.metadata.items():
        clauses.append(labels[key].as_string() == value)
    if wanted.rating is not None:
        clauses.append(exists(rated.where(Feedback.rating == wanted.rating)))
    if wanted.has_feedback is not None:
        clauses.append(exists(rated) if wanted.has_feedback else ~exists(rated))
    if wanted.since is not None:
        clauses.append(StoredCompletion.created_at >= wanted.since)
    if wanted.until is not None:
        clauses.append(StoredCompletion.created_at < wanted.until)
    return clauses


async def page_of(
    session: AsyncSession,
    team_id: int,
    wanted: StoredCompletionFilter,
    after: str | None,
    limit: int,
    order: Order,
) -> list[StoredCompletion]:
    """Up to `limit + 1` of the team's stored completions the filter picks, in creation
    order (`asc`: oldest first, OpenAI's default), those after the completion `after` (one
    that is not the team's: from the start)."""
    query = select(StoredCompletion).where(*matching(team_id, wanted))
    column: Any = StoredCompletion.id
    if after is not None:
        cursor = (
            await session.execute(
                select(StoredCompletion.id).where(
                    StoredCompletion.public_id == after, StoredCompletion.team_id == team_id
                )
            )
        ).scalar_one_or_none()
        if cursor is not None:
            query = query.where(column > cursor if order is Order.asc else column < cursor)
    query = query.order_by(column.asc() if order is Order.asc else column.desc())
    return list((await session.execute(query.limit(limit + 1))).scalars())


async def picked(
    session: AsyncSession, team_id: int, wanted: StoredCompletionFilter
) -> list[StoredCompletion]:
    """What a dataset's filter reads: the newest `limit` that match, oldest first."""
    query = (
        select(StoredCompletion)
        .where(*matching(team_id, wanted), StoredCompletion.kind == "chat")
        .order_by(StoredCompletion.id.desc())  # type: ignore[union-attr]
        .limit(wanted.limit)
    )
    return list(reversed((await session.execute(query)).scalars().all()))


async def named(
    session: AsyncSession, team_id: int, public_ids: Sequence[str]
) -> dict[str, StoredCompletion]:
    """The team's stored completions among these ids, by id."""
    query = select(StoredCompletion).where(
        StoredCompletion.team_id == team_id, StoredCompletion.public_id.in_(public_ids)
    )
    return {row.public_id: row for row in (await session.execute(query)).scalars()}


async def set_metadata(
    session: AsyncSession, row: StoredCompletion, metadata: dict[str, str]
) -> StoredCompletion:
    row.metadata_ = dict(metadata)
    session.add(row)
    await session.commit()
    await session.refresh(row)
    return row


async def delete_completion(session: AsyncSession, row: StoredCompletion) -> None:
    """The completion and its feedback (a database without cascades deletes it too)."""
    await session.execute(delete(Feedback).where(Feedback.completion_id == row.id))
    await session.execute(delete(StoredCompletion).where(StoredCompletion.id == row.id))
    await session.commit()


async def add_feedback(
    session: AsyncSession, row: StoredCompletion, given: FeedbackCreate
) -> Feedback:
    assert row.id is not None
    feedback = Feedback(
        completion_id=row.id,
        team_id=row.team_id,
        rating=given.rating,
        correction=given.correction,
        author=given.author,
    )
    session.add(feedback)
    await session.commit()
    await session.refresh(feedback)
    return feedback


@dataclass(frozen=True)
class Given:
    """The feedback on each of some completions, oldest first, by completion row id."""

    by_completion: dict[int, list[Feedback]]

    def of(self, row: StoredCompletion) -> list[Feedback]:
        return self.by_completion.get(row.id or 0, [])


async def feedback_on(session: AsyncSession, rows: Sequence[StoredCompletion]) -> Given:
    ids = [row.id for row in rows]
    found: dict[int, list[Feedback]] = {}
    if ids:
        query = select(Feedback).where(Feedback.completion_id.in_(ids)).order_by(Feedback.id)
        for feedback in (await session.execute(query)).scalars():
            found.setdefault(feedback.completion_id, []).append(feedback)
    return Given(found)
