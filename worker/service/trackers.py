"""A job's MLflow mirror in the service: only to the tracking servers the operator allows,
into the run kept on the job row (so every attempt writes the same run; one that died
before the id was kept is found by the job's run key), with its outage events in the job's
timeline, its steps sent once the database holds the state saved after them (no attempt can
replay them then), and those a crash kept from the tracker sent by the next attempt from
the database.

And the end of every mirrored job's run, whoever ended the job: the workers end the runs
the MLflow outbox lists (app/jobs/mlflow_endings.py), retrying while MLflow is away."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from datetime import datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.core.config import Settings
from app.core.tables import utcnow
from app.jobs.mlflow_endings import Ending, drop_ending, take_endings
from app.jobs.tables import Job
from app.records.store import record_event, record_mlflow_run, recorded_steps
from kernel.retry import Backoff
from kernel.spec import JobSpec, stored_spec
from kernel.spec.checks import unlisted_tracker
from worker.engine.tracking.mlflow_mirror import MlflowSink, end_run, transient
from worker.service.db_sink import DatabaseSink, persist

log = logging.getLogger(__name__)
ENDINGS_AT_ONCE = 20
ENDING_BACKOFF = Backoff(initial=60.0, cap=900.0)
"""When an ending is tried again after a try (MLflow away); longer than a try may take
(three calls of at most 15 s each), so two workers do not try one ending at once."""

WRITES: set[asyncio.Task[Any]] = set()
"""The mirrors' database writes in flight (held here, or the event loop could drop them)."""


def run_key(job_id: int, created_at: datetime) -> str:
    """What names a job's MLflow run (its `opd.run_key` tag): the job, and when it was made,
    so that two deployments' job 12 on one MLflow server are two runs."""
    return f"job-{job_id}@{created_at.isoformat()}"


def in_background(write: Coroutine[Any, Any, Any]) -> None:
    task = asyncio.get_running_loop().create_task(write)
    WRITES.add(task)
    task.add_done_callback(WRITES.discard)


def mlflow_mirror(
    settings: Settings,
    sessions: async_sessionmaker[AsyncSession],
    job: Job,
    spec: JobSpec,
    db: DatabaseSink,
) -> MlflowSink | None:
    """The job's mirror, or None when it has none (or may not have it: an event says so)."""
    tracker = spec.trackers.mlflow
    if tracker is None:
        return None
    job_id = job.id
    if refusal := unlisted_tracker(spec, settings.mlflow_tracking_uris):
        db.event("warning", f"MLflow mirroring is off: {refusal}")
        return None

    def notify(level: str, message: str, data: dict[str, Any] | None) -> None:
        in_background(
            persist(
                sessions,
                f"job {job_id} MLflow event",
                lambda session: record_event(session, job_id, level, message, data),
            )
        )

    def keep_run(run_id: str) -> None:
        in_background(
            persist(
                sessions,
                f"job {job_id} MLflow run",
                lambda session: record_mlflow_run(session, job_id, run_id),
            )
        )

    async def backfill(first: int, last: int) -> list[tuple[int, dict[str, Any], int]]:
        rows = await persist(
            sessions,
            f"job {job_id} steps for MLflow",
            lambda session: recorded_steps(session, job_id, first, last),
        )
        return [(step, metrics, int(at.timestamp() * 1000)) for step, metrics, at in rows]

    return MlflowSink(
        tracker,
        run_id=job.mlflow_run_id,
        run_key=run_key(job_id, job.created_at),
        tags={"opd.job_id": str(job_id), "opd.team_id": str(job.team_id)},
        notify=notify,
        on_run=keep_run,
        after_recorded=db.then,
        backfill=backfill,
        team_view=True,
    )


async def end_runs(sessions: async_sessionmaker[AsyncSession], settings: Settings) -> int:
    """One pass over the MLflow runs due to end: each taken (another worker leaves it until
    its next try), ended in a thread (MLflow's client blocks), then dropped; a failed try
    waits for the next one, until the ending's retry window has passed. Returns how many
    were dropped."""
    async with sessions() as session:
        due = await take_endings(session, utcnow(), ENDING_BACKOFF, ENDINGS_AT_ONCE)
    return sum([await end_one(sessions, settings, ending) for ending in due])


async def end_one(
    sessions: async_sessionmaker[AsyncSession], settings: Settings, ending: Ending
) -> bool:
    """End one job's run and drop its ending; False (kept) when a later try may succeed."""
    job_id = ending.job_id
    spec = stored_spec(ending.spec)
    tracker = spec.trackers.mlflow
    if tracker is not None and not unlisted_tracker(spec, settings.mlflow_tracking_uris):
        key = run_key(job_id, ending.created_at)
        try:
            run_id = await asyncio.to_thread(end_run, tracker, ending.run_id, key, ending.status)
        except Exception as error:
            if not ending.expired and (isinstance(error, ImportError) or transient(error)):
                log.warning("job %s: its MLflow run did not end, retrying: %s", job_id, error)
                return False
            message = f"MLflow run not ended: {tracker.tracking_uri} refused it: {error}"
            data = {"run_id": ending.run_id}
            await persist(
                sessions,
                f"job {job_id} MLflow event",
                lambda session: record_event(session, job_id, "warning", message, data),
            )
        else:
            if run_id is not None and ending.run_id is None:
                await persist(
                    sessions,
                    f"job {job_id} MLflow run",
                    lambda session: record_mlflow_run(session, job_id, run_id),
                )
    await persist(
        sessions, f"job {job_id} MLflow ending", lambda session: drop_ending(session, job_id)
    )
    return True


async def end_runs_forever(sessions: async_sessionmaker[AsyncSession], settings: Settings) -> None:
    while True:
        try:
            await end_runs(sessions, settings)
        except Exception as error:  # the database may be away; try next time
            log.warning("ending MLflow runs failed: %s", error)
        await asyncio.sleep(settings.requeue_interval)
