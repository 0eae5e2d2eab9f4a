"""The outbox of MLflow runs to end: a job with `trackers.mlflow` that reaches a terminal
status gets a row in the transaction of that change, whoever makes it (its worker, the API
cancelling a paused or queued job, a worker carrying out a dead worker's cancel), so its run
never stays RUNNING for want of a worker mirroring the end. The workers end the runs
(worker/service/trackers.py); the API imports no MLflow."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from app.core.db import insert_for
from app.jobs.schemas import TERMINAL_STATUSES, JobStatus
from app.jobs.tables import Job, MlflowEnding
from kernel.retry import Backoff

TRY_FOR = timedelta(hours=24)
"""How long an ending is retried while MLflow is away (as a webhook's delivery is)."""


async def add_mlflow_ending(
    session: AsyncSession, job: Job, target: JobStatus, now: datetime
) -> None:
    """The ending a transition of `job` to `target` makes, if it is terminal and the job is
    mirrored (the caller commits)."""
    if target not in TERMINAL_STATUSES or not (job.spec.get("trackers") or {}).get("mlflow"):
        return
    dialect = (await session.connection()).dialect.name
    row = {"job_id": job.id, "status": target.value, "created_at": now, "next_attempt_at": now}
    await session.execute(insert_for(dialect)(MlflowEnding).values(row).on_conflict_do_nothing())


@dataclass(frozen=True)
class Ending:
    """A run to end: the job's id, status, spec, run id (if a worker kept it) and creation
    time (what its run key is made of); `expired` once its retry window has passed."""

    job_id: int
    status: str
    spec: dict[str, Any]
    run_id: str | None
    created_at: datetime
    expired: bool


async def take_endings(
    session: AsyncSession, now: datetime, backoff: Backoff, limit: int
) -> list[Ending]:
    """Up to `limit` endings due now, each taken by moving its next attempt on by the
    backoff's delay for its attempts so far (so another worker leaves it until then, and a
    failed attempt needs no more writes). Commits."""
    due = await session.execute(
        select(MlflowEnding, Job.spec, Job.mlflow_run_id, Job.created_at)
        .join(Job, Job.id == MlflowEnding.job_id)
        .where(MlflowEnding.next_attempt_at <= now)
        .order_by(MlflowEnding.next_attempt_at)
        .limit(limit)
    )
    taken = []
    for ending, spec, run_id, created_at in list(due):
        moved = await session.execute(
            update(MlflowEnding)
            .where(MlflowEnding.job_id == ending.job_id, MlflowEnding.attempts == ending.attempts)
            .values(
                next_attempt_at=now + timedelta(seconds=backoff.delay(ending.attempts)),
                attempts=ending.attempts + 1,
            )
            .execution_options(synchronize_session=False)
        )
        if moved.rowcount == 1:
            expired = ending.created_at + TRY_FOR <= now
            taken.append(Ending(ending.job_id, ending.status, spec, run_id, created_at, expired))
    await session.commit()
    return taken


async def drop_ending(session: AsyncSession, job_id: int) -> None:
    """The run ended (or will never be found): commits."""
    await session.execute(delete(MlflowEnding).where(MlflowEnding.job_id == job_id))
    await session.commit()
