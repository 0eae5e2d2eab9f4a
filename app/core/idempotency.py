"""An Idempotency-Key and the request it came with: a request sent again with the same key
(a retry after a lost answer) is answered with what the first made, and the same key with
another request is refused. Jobs, sweeps, playground samples and file uploads keep one per
team; a row a request makes (a job, a sweep) is stored once by `insert_once`."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, TypeVar

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from app.core.db import detach

Row = TypeVar("Row")


@dataclass(frozen=True)
class Idempotency:
    """An Idempotency-Key and the request it came with, as its client sent it (the route
    and its parsed JSON body, not the spec made of it): a retry is the same request
    whatever defaults the spec gained since."""

    key: str
    route: str
    body: Any

    @property
    def fingerprint(self) -> str:
        """A digest of the request, keys sorted: however it was formatted, it hashes alike."""
        canonical = json.dumps(
            [self.route, self.body],
            sort_keys=True,
            separators=(",", ":"),
            ensure_ascii=False,
            default=str,  # a YAML form's dates
        )
        return hashlib.sha256(canonical.encode()).hexdigest()


class IdempotencyMismatch(ValueError):
    """An Idempotency-Key was reused with a different request body."""


async def insert_once(
    session: AsyncSession, row: Row, idempotency: Idempotency | None, noun: str
) -> tuple[Row, bool]:
    """Flush the new `row` (whose table has `team_id`, `idempotency_key` and
    `request_hash`, unique per team and key), stamped with `idempotency`: (row, True); for
    a repeat of the request, (the row it first made, False), the session rolled back.
    IdempotencyMismatch for the key used with another request; an IntegrityError of
    anything else is raised as it was."""
    if idempotency is not None:
        row.idempotency_key = idempotency.key  # type: ignore[attr-defined]
        row.request_hash = idempotency.fingerprint  # type: ignore[attr-defined]
    session.add(row)
    try:
        await session.flush()
    except IntegrityError:
        await session.rollback()
        if idempotency is None:
            raise
        table: Any = type(row)
        query = select(table).where(
            table.team_id == row.team_id,  # type: ignore[attr-defined]
            table.idempotency_key == idempotency.key,
        )
        existing = (await session.execute(query)).scalar_one_or_none()
        if existing is None:
            raise
        if existing.request_hash != idempotency.fingerprint:
            raise IdempotencyMismatch(
                f"Idempotency-Key {idempotency.key!r} was already used for {noun} "
                f"{existing.id} with a different body; use a new key for a new {noun}"
            ) from None
        return detach(session, existing), False
    return row, True
