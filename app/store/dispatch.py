"""The queue's bookkeeping in the database: which jobs need a (new) message, how often a
job was sent, and why a queued job still waits."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import or_, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from app.models import ACTIVE_STATUSES, Job, JobStatus, utcnow
from app.store.transitions import RUNNABLE_STATUSES


async def orphaned_job_ids(
    session: AsyncSession,
    *,
    heartbeat_timeout: float,
    queued_for: float,
) -> list[int]:
    """Jobs the sweeper should (re-)enqueue: active ones without a heartbeat for
    `heartbeat_timeout` seconds, and ones queued for `queued_for` seconds or more."""
    now = utcnow()
    stale_before = now - timedelta(seconds=heartbeat_timeout)
    active = Job.status.in_(ACTIVE_STATUSES) & or_(
        Job.heartbeat_at.is_(None), Job.heartbeat_at < stale_before
    )
    waiting = (Job.status == JobStatus.queued) & (
        Job.updated_at < now - timedelta(seconds=queued_for)
    )
    rows = await session.execute(select(Job.id).where(active | waiting).order_by(Job.id))
    return list(rows.scalars())


async def next_enqueue_count(session: AsyncSession, job_id: int) -> int | None:
    """Count one more send of a job that should run (queued, or active with a dead worker)
    and return the count; None if the job should not run (it ended or is paused)."""
    result = await session.execute(
        update(Job)
        .where(Job.id == job_id, Job.status.in_(RUNNABLE_STATUSES))
        .values(enqueue_count=Job.enqueue_count + 1, queue_reason=None)
        .returning(Job.enqueue_count)
    )
    count = result.scalar_one_or_none()
    await session.commit()
    return count


async def set_queue_reason(session: AsyncSession, job_id: int, reason: str | None) -> None:
    """Say why a queued job waits (e.g. the queue was unreachable); no-op once it left."""
    await session.execute(
        update(Job)
        .where(Job.id == job_id, Job.status == JobStatus.queued)
        .values(queue_reason=reason)
    )
    await session.commit()
