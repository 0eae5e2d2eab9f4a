"""What operators count, read from the database at scrape time: jobs by status, workers
alive by their jobs' heartbeats, and the steps recorded in the last minute."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from app.core.tables import utcnow
from app.curves.tables import StepMetric
from app.jobs.limits import LIMIT_REASON
from app.jobs.schemas import ACTIVE_STATUSES, JobStatus
from app.jobs.tables import Job

STEP_TIME = "time/step_elapsed_time"
WINDOW_STEPS = 5_000
"""Steps per job looked at for the recent window: enough for 80 steps/s over a minute, and
a bound on the rows a scrape reads however long a job is."""


@dataclass(frozen=True)
class ServiceStats:
    jobs_by_status: dict[str, int]
    jobs_waiting_for_queue: int
    live_workers: int
    recent_steps: int
    recent_step_seconds: list[float]


async def service_stats(
    session: AsyncSession, heartbeat_timeout: float, window_seconds: float
) -> ServiceStats:
    """Counts for the whole service (every team). `recent_*` cover the steps recorded in
    the last `window_seconds`, with their `time/step_elapsed_time` where recorded."""
    now = utcnow()
    rows = await session.execute(select(Job.status, func.count()).group_by(Job.status))
    counts = {status: count for status, count in rows}
    waiting = (
        await session.execute(
            select(func.count()).where(
                Job.status == JobStatus.queued,
                Job.queue_reason.is_not(None),
                ~Job.queue_reason.startswith(LIMIT_REASON),  # those wait for their team
            )
        )
    ).scalar_one()
    workers = (
        await session.execute(
            select(func.count(func.distinct(Job.worker_id))).where(
                Job.status.in_(ACTIVE_STATUSES),
                Job.heartbeat_at >= now - timedelta(seconds=heartbeat_timeout),
            )
        )
    ).scalar_one()
    since = now - timedelta(seconds=window_seconds)
    step_time = StepMetric.metrics[STEP_TIME].as_float()
    recent = (
        await session.execute(
            select(step_time)
            .join(Job, Job.id == StepMetric.job_id)
            .where(
                Job.updated_at >= since,
                StepMetric.step >= Job.steps_done - WINDOW_STEPS,
                StepMetric.recorded_at >= since,
            )
        )
    ).scalars()
    seconds = list(recent)
    return ServiceStats(
        jobs_by_status={status.value: counts.get(status.value, 0) for status in JobStatus},
        jobs_waiting_for_queue=waiting,
        live_workers=workers,
        recent_steps=len(seconds),
        recent_step_seconds=[value for value in seconds if value is not None],
    )
