"""Requests answered once: work sent with an Idempotency-Key that no job row records (a
playground sample, a chat completion) gets a `replays` row before it starts, and its
answer kept there, with its usage, in one transaction. A repeat of the request (the same
team, key, route and body) within REPLAY_FOR is answered from that row: the work is not
done, nor billed, twice. The same key with another request is an IdempotencyMismatch."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import delete, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from app.core.idempotency import Idempotency, IdempotencyMismatch
from app.playground.tables import Replay

REPLAY_FOR = timedelta(hours=1)
"""How long an answer is kept for a repeat: retries come within seconds or minutes."""
CLAIM_ATTEMPTS = 3


@dataclass(frozen=True)
class Claim:
    """The row of a request: `first` when this sending made it; `task_id` the worker task
    its work goes as (each sending asks for that task: the first one sent is the one
    done); `answer` once one is kept."""

    id: int
    task_id: str
    first: bool
    answer: str | None


async def claim(
    session: AsyncSession, team_id: int, idempotency: Idempotency, now: datetime
) -> Claim:
    """The row of this request: made now, or the one an earlier sending of it made (the
    caller joins its work, or replays its answer). Rows past their time are dropped first.
    Commits."""
    await session.execute(delete(Replay).where(Replay.expires_at <= now))
    await session.commit()
    for _ in range(CLAIM_ATTEMPTS):
        task_id = f"replay-{uuid.uuid4().hex}"
        row = Replay(
            team_id=team_id,
            idempotency_key=idempotency.key,
            request_hash=idempotency.fingerprint,
            task_id=task_id,
            created_at=now,
            expires_at=now + REPLAY_FOR,
        )
        session.add(row)
        try:
            await session.flush()
        except IntegrityError:
            await session.rollback()
        else:
            made = row.id
            await session.commit()
            assert made is not None
            return Claim(made, task_id, first=True, answer=None)
        existing = (
            await session.execute(
                select(Replay.id, Replay.task_id, Replay.request_hash, Replay.answer).where(
                    Replay.team_id == team_id, Replay.idempotency_key == idempotency.key
                )
            )
        ).one_or_none()
        await session.rollback()
        if existing is None:  # its first sending failed and let it go meanwhile
            continue
        if existing.request_hash != idempotency.fingerprint:
            raise IdempotencyMismatch(
                f"Idempotency-Key {idempotency.key!r} was already used for another request; "
                "use a new key for a new request"
            )
        return Claim(existing.id, existing.task_id, first=False, answer=existing.answer)
    raise IdempotencyMismatch(
        f"Idempotency-Key {idempotency.key!r} is being used by requests that keep failing; "
        "use a new key"
    )


async def kept_first(session: AsyncSession, claim_id: int, answer: str) -> str | None:
    """Keep `answer` as the row's, in the caller's transaction; returns the answer another
    sending kept first (then this one is not to be kept, nor billed), else None."""
    kept = await session.execute(
        update(Replay)
        .where(Replay.id == claim_id, Replay.answer.is_(None))
        .values(answer=answer)
        .execution_options(synchronize_session=False)
    )
    if kept.rowcount == 1:
        return None
    return (
        await session.execute(select(Replay.answer).where(Replay.id == claim_id))
    ).scalar_one_or_none()


async def release(session: AsyncSession, claim_id: int) -> None:
    """Drop a row no answer was kept for (its work failed): sending the request again tries
    anew. Commits."""
    await session.execute(delete(Replay).where(Replay.id == claim_id, Replay.answer.is_(None)))
    await session.commit()
