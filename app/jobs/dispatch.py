"""The queue's bookkeeping in the database: which jobs need a (new) message, how often a
job was sent, and why a queued job still waits."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import ColumnElement, or_, select, tuple_, update
from sqlalchemy.ext.asyncio import AsyncSession

from app.core.queue import JobQueue, QueueUnavailable, log
from app.core.tables import utcnow
from app.jobs.limits import Limits, limited_teams
from app.jobs.schemas import ACTIVE_STATUSES, JobStatus
from app.jobs.tables import Job
from app.jobs.transitions import RUNNABLE_STATUSES

RESEND_BATCH = 500  # candidates per UPDATE: well inside every database's bound-parameter limit


@dataclass(frozen=True)
class Candidate:
    """A job the requeuer may have to send again, as it was when listed."""

    id: int
    status: str
    enqueue_count: int


def stale_heartbeat(heartbeat_timeout: float) -> ColumnElement[bool]:
    stale_before = utcnow() - timedelta(seconds=heartbeat_timeout)
    return or_(Job.heartbeat_at.is_(None), Job.heartbeat_at < stale_before)


async def requeue_candidates(
    session: AsyncSession,
    *,
    heartbeat_timeout: float,
    queued_for: float,
    limits: Limits | None = None,
) -> list[Candidate]:
    """Jobs the requeuer should (re-)enqueue, in one query: active ones without a heartbeat
    for `heartbeat_timeout` seconds, and ones queued for `queued_for` seconds or more whose
    team may start another job (the others wait for one of their team's to end)."""
    active = Job.status.in_(ACTIVE_STATUSES) & stale_heartbeat(heartbeat_timeout)
    waiting = (
        (Job.status == JobStatus.queued)
        & (Job.updated_at < utcnow() - timedelta(seconds=queued_for))
        & Job.team_id.not_in(limited_teams(limits or Limits()))
    )
    rows = await session.execute(
        select(Job.id, Job.status, Job.enqueue_count).where(active | waiting).order_by(Job.id)
    )
    return [Candidate(*row) for row in rows]


async def count_resends(
    session: AsyncSession, candidates: Sequence[Candidate], heartbeat_timeout: float
) -> list[tuple[int, int]]:
    """Count one more send of each candidate that still needs one and return (job id,
    count) pairs: a queued job nobody sent since it was listed, an active job no worker
    took over meanwhile. One statement per RESEND_BATCH candidates."""
    counted: list[tuple[int, int]] = []
    for start in range(0, len(candidates), RESEND_BATCH):
        batch = candidates[start : start + RESEND_BATCH]
        listed = [(c.id, c.enqueue_count) for c in batch if c.status == JobStatus.queued]
        active = [c.id for c in batch if c.status in ACTIVE_STATUSES]
        result = await session.execute(
            update(Job)
            .where(
                ((Job.status == JobStatus.queued) & tuple_(Job.id, Job.enqueue_count).in_(listed))
                | (
                    Job.status.in_(ACTIVE_STATUSES)
                    & Job.id.in_(active)
                    & stale_heartbeat(heartbeat_timeout)
                )
            )
            .values(enqueue_count=Job.enqueue_count + 1, queue_reason=None)
            .returning(Job.id, Job.enqueue_count)
        )
        counted.extend((job_id, count) for job_id, count in result)
    await session.commit()
    return sorted(counted)


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


async def set_queue_reason(
    session: AsyncSession, job_ids: Sequence[int], reason: str | None
) -> None:
    """Say why queued jobs wait (e.g. the queue was unreachable); no-op for those that left."""
    await session.execute(
        update(Job)
        .where(Job.id.in_(job_ids), Job.status == JobStatus.queued)
        .values(queue_reason=reason)
    )
    await session.commit()


async def send_counted(
    session: AsyncSession, queue: JobQueue, sends: Sequence[tuple[int, int]]
) -> list[int]:
    """Push each counted (job id, enqueue count) send; returns the ids sent. Once Redis
    fails, the rest keep waiting with the reason written on them, for the requeuer."""
    sent: list[int] = []
    for job_id, count in sends:
        try:
            await queue.push(job_id, count)
        except QueueUnavailable as error:
            waiting = [unsent for unsent, _ in sends[len(sent) :]]
            log.warning("jobs %s stay queued: %s", waiting, error)
            reason = f"{error}; it will be enqueued when Redis is back"
            await set_queue_reason(session, waiting, reason)
            break
        sent.append(job_id)
    return sent


async def enqueue_job(session: AsyncSession, queue: JobQueue, job_id: int) -> bool:
    """Send a job (queued, or active with a dead worker) to the workers; True if sent.
    If Redis fails, the job keeps waiting with the reason on it, for the requeuer."""
    count = await next_enqueue_count(session, job_id)
    if count is None:
        return False
    return bool(await send_counted(session, queue, [(job_id, count)]))
