"""What uploads and deletes in flight hold, so that a team's quota and objects are decided
under one lock per team, on SQLite and Postgres, across API processes:

- an upload reserves the bytes it may store as it starts (its declared size, else as its
  body arrives, a step ahead), each reservation checked against the quota together with the
  team's files and every other live claim; its row is inserted against the same count;
- once its bytes are known, it claims their object: no delete removes that object
  meanwhile, and a delete of it under way is waited out before the upload writes it;
- a delete that leaves no file of the team with those bytes claims the object until it is
  gone (a tombstone), and removes it only then, after its own row's delete is committed.

A claim holds until it ends or `expires_at` passes: an upload renews its own while it runs,
so a process that died holds nothing for longer than LEASE_SECONDS.

The lock: on Postgres an advisory transaction lock per team (job submissions, which lock
the team's row, are not held up); SQLite has one writer at a time, and every transaction
here writes first and reads after, so what it checks is what it commits against.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import delete, func, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from app.core.db import lock_team
from app.core.tables import utcnow
from app.files.errors import FileRefused, over_quota
from app.files.store import team_bytes
from app.files.tables import FileClaim, UploadedFile

log = logging.getLogger(__name__)

UPLOAD, DELETE = "upload", "delete"
LEASE_SECONDS = 120
RENEW_SECONDS = 30
RESERVE_AHEAD = 8 << 20
"""A body of unknown size reserves as much again as has arrived, up to this much past it
(fewer writes; little held that another upload could use)."""
POLL_SECONDS = 0.1
LOCKS = 36_004
"""The first key of the files' advisory locks (the second: the team)."""


async def lock_team_files(session: AsyncSession, team_id: int) -> None:
    """Hold the lock of the team's files until the transaction ends (app/core/db.py)."""
    await lock_team(session, LOCKS, team_id)


def lease(now: datetime, seconds: float = LEASE_SECONDS) -> datetime:
    return now + timedelta(seconds=seconds)


async def others_reserved(session: AsyncSession, team_id: int, now: datetime, but: int) -> int:
    """Bytes the team's live upload claims other than `but` hold."""
    query = select(func.coalesce(func.sum(FileClaim.bytes), 0)).where(
        FileClaim.team_id == team_id,
        FileClaim.kind == UPLOAD,
        FileClaim.expires_at > now,
        FileClaim.id != but,
    )
    return int((await session.execute(query)).scalar() or 0)


async def used(session: AsyncSession, team_id: int, now: datetime, but: int) -> int:
    """What the team's files hold and its other uploads in flight have reserved."""
    return await team_bytes(session, team_id) + await others_reserved(session, team_id, now, but)


@dataclass
class Reservation:
    """An upload's claim (`id`) and the bytes it holds of its team's quota."""

    session: AsyncSession
    id: int
    team_id: int
    quota: int
    bytes: int

    async def cover(self, size: int) -> None:
        """Hold at least `size` bytes, else FileRefused (over the quota)."""
        if size > self.bytes:
            self.bytes = await grow(self.session, self.id, self.team_id, size, self.quota)


async def reserve(session: AsyncSession, team_id: int, amount: int, quota: int) -> Reservation:
    """A new upload claim of `amount` bytes; over the quota, FileRefused and none. Expired
    claims of the team (a process that died) are removed on the way."""
    now = utcnow()
    await lock_team_files(session, team_id)
    claim = FileClaim(team_id=team_id, kind=UPLOAD, bytes=amount, expires_at=lease(now))
    session.add(claim)
    await session.flush()
    assert claim.id is not None
    await session.execute(
        delete(FileClaim).where(FileClaim.team_id == team_id, FileClaim.expires_at <= now)
    )
    taken = await used(session, team_id, now, claim.id)
    if taken + amount > quota:
        await session.rollback()
        raise over_quota(taken, quota)
    await session.commit()
    return Reservation(session, claim.id, team_id, quota, amount)


async def grow(session: AsyncSession, claim_id: int, team_id: int, size: int, quota: int) -> int:
    """Reserve at least `size` bytes for the upload (twice that, or RESERVE_AHEAD more,
    where the quota leaves room); the bytes reserved now. FileRefused when the quota leaves
    less than `size`."""
    now = utcnow()
    await lock_team_files(session, team_id)
    await session.execute(
        update(FileClaim).where(FileClaim.id == claim_id).values(expires_at=lease(now))
    )
    taken = await used(session, team_id, now, claim_id)
    if taken + size > quota:
        await session.rollback()
        raise over_quota(taken, quota)
    amount = min(size + min(size, RESERVE_AHEAD), quota - taken)
    await session.execute(update(FileClaim).where(FileClaim.id == claim_id).values(bytes=amount))
    await session.commit()
    return amount


async def wait_for_deletion() -> None:
    """A delete of the object is under way: look again in a moment."""
    await asyncio.sleep(POLL_SECONDS)


async def claim_object(session: AsyncSession, claim_id: int, team_id: int, sha256: str) -> None:
    """Let the upload count on the object of `sha256` (no delete removes it now), once no
    delete of it is under way: one is waited out (it ends, or its claim expires)."""
    while True:
        now = utcnow()
        await lock_team_files(session, team_id)
        await session.execute(
            update(FileClaim)
            .where(FileClaim.id == claim_id)
            .values(sha256=sha256, expires_at=lease(now))
        )
        deleting = await session.execute(
            select(FileClaim.id)
            .where(
                FileClaim.team_id == team_id,
                FileClaim.kind == DELETE,
                FileClaim.sha256 == sha256,
                FileClaim.expires_at > now,
            )
            .limit(1)
        )
        if deleting.first() is None:
            await session.commit()
            return
        await session.rollback()
        await wait_for_deletion()


async def settle(session: AsyncSession, claim_id: int, team_id: int, size: int, quota: int) -> None:
    """After the upload's row is added (flushed, under the team's lock): its claim ends, and
    the team's files with every other live claim still fit the quota, else FileRefused and
    nothing is kept. A claim that expired (the database was away longer than its lease) may
    no longer protect the object: the upload is refused, to be sent again."""
    now = utcnow()
    ended = await session.execute(
        delete(FileClaim).where(FileClaim.id == claim_id, FileClaim.expires_at > now)
    )
    if not ended.rowcount:
        await session.rollback()
        raise FileRefused(
            503, "upload_interrupted", "the upload could not be recorded in time; send it again"
        )
    taken = await used(session, team_id, now, claim_id)
    if taken > quota:
        await session.rollback()
        raise over_quota(taken - size, quota)


async def release(session: AsyncSession, claim_id: int) -> None:
    """End a claim (an upload refused, a delete done); one left behind expires anyway."""
    try:
        await session.rollback()
        await session.execute(delete(FileClaim).where(FileClaim.id == claim_id))
        await session.commit()
    except Exception:  # the database away: the claim's lease ends it
        log.warning("could not end file claim %s; it expires by itself", claim_id, exc_info=True)


async def renew(session: AsyncSession, claim_id: int) -> None:
    """Extend the claim's lease (the caller commits)."""
    await session.execute(
        update(FileClaim).where(FileClaim.id == claim_id).values(expires_at=lease(utcnow()))
    )


@asynccontextmanager
async def renewed(session: AsyncSession, claim_id: int) -> AsyncIterator[None]:
    """Keep the claim alive while the block runs (in sessions of its own: the request's is
    the block's), RENEW_SECONDS apart."""

    async def renew_often() -> None:
        while True:
            await asyncio.sleep(RENEW_SECONDS)
            try:
                async with AsyncSession(session.bind) as own:
                    await renew(own, claim_id)
                    await own.commit()
            except Exception:  # a missed renewal: the next one tries again
                log.warning("could not renew file claim %s", claim_id, exc_info=True)

    task = asyncio.create_task(renew_often())
    try:
        yield
    finally:
        task.cancel()
        with suppress(asyncio.CancelledError):
            await task


async def claim_deletion(
    session: AsyncSession, team_id: int, sha256: str, lease_seconds: float
) -> int | None:
    """After a file's row is deleted (flushed, under the team's lock): when no file of the
    team has these bytes any more and no upload counts on them, a delete claim on their
    object, its id (the caller removes the object once this is committed); else None."""
    now = utcnow()
    kept = await session.execute(
        select(UploadedFile.id)
        .where(UploadedFile.team_id == team_id, UploadedFile.sha256 == sha256)
        .limit(1)
    )
    counted_on = await session.execute(
        select(FileClaim.id)
        .where(
            FileClaim.team_id == team_id,
            FileClaim.kind == UPLOAD,
            FileClaim.sha256 == sha256,
            FileClaim.expires_at > now,
        )
        .limit(1)
    )
    if kept.first() is not None or counted_on.first() is not None:
        return None
    claim = FileClaim(
        team_id=team_id, kind=DELETE, sha256=sha256, expires_at=lease(now, lease_seconds)
    )
    session.add(claim)
    await session.flush()
    return claim.id
