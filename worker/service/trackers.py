"""A job's MLflow mirror in the service: only to the tracking servers the operator allows,
into the run kept on the job row (so every attempt writes the same run), with its outage
events in the job's timeline, its steps sent once the database holds the state saved after
them (no attempt can replay them then), and those a crash kept from the tracker sent by the
next attempt from the database."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.core.config import Settings
from app.models import Job
from app.store.records import record_event, record_mlflow_run, recorded_steps
from kernel.spec import JobSpec, unlisted_tracker
from worker.engine.mlflow_mirror import MlflowSink
from worker.service.db_sink import DatabaseSink, persist

WRITES: set[asyncio.Task[Any]] = set()
"""The mirrors' database writes in flight (held here, or the event loop could drop them)."""


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
        tags={"opd.job_id": str(job_id), "opd.team_id": str(job.team_id)},
        notify=notify,
        on_run=keep_run,
        after_recorded=db.then,
        backfill=backfill,
    )
