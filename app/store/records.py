"""What a run reports, appended as it happens: step metrics, saved weights, timeline events.

A step's metrics are upserted on (job_id, step), so a step replayed after a crash
overwrites its row and the table holds each step once; the block summaries that charts
read follow in the same transaction (store/summaries.py).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession

from app.models import (
    Checkpoint,
    CheckpointKind,
    Event,
    EventLevel,
    Job,
    JobAction,
    StepMetric,
    finite_or_none,
    utcnow,
)
from app.store.errors import JobNotHeld
from app.store.rows import detach, event_row, held
from app.store.summaries import keep_summaries, probe_step


async def record_event(
    session: AsyncSession,
    job_id: int,
    level: EventLevel | str,
    message: str,
    data: dict[str, Any] | None = None,
) -> Event:
    """Append one line to the job's timeline."""
    event = event_row(job_id, message, EventLevel(level), data)
    session.add(event)
    await session.commit()
    return detach(session, event)


def upsert_metrics(
    dialect: str, job_id: int, step: int, metrics: dict[str, Any], now: datetime
) -> Any:
    """INSERT .. ON CONFLICT (job_id, step) DO UPDATE, spelled for the session's database."""
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    statement = insert(StepMetric).values(
        job_id=job_id, step=step, metrics=metrics, recorded_at=now
    )
    return statement.on_conflict_do_update(
        index_elements=["job_id", "step"],
        set_={"metrics": statement.excluded.metrics, "recorded_at": statement.excluded.recorded_at},
    )


async def record_step(
    session: AsyncSession,
    job_id: int,
    worker_id: str,
    step: int,
    metrics: dict[str, float],
) -> JobAction | None:
    """Store step `step`'s metrics (a replayed step overwrites its row) and keep the
    summaries, advance steps_done to step + 1 and beat, in one transaction. Returns the
    requested action."""
    now = utcnow()
    result = await session.execute(
        update(Job)
        .where(*held(job_id, worker_id))
        .values(steps_done=step + 1, heartbeat_at=now, updated_at=now)
        .returning(Job.requested_action)
    )
    row = result.one_or_none()
    if row is None:
        await session.rollback()
        raise JobNotHeld(f"job {job_id} is no longer held by {worker_id}")
    clean = {name: finite_or_none(value) for name, value in metrics.items()}
    newest, before = await probe_step(session, job_id, step)
    dialect = (await session.connection()).dialect.name
    await session.execute(upsert_metrics(dialect, job_id, step, clean, now))
    await keep_summaries(session, job_id, step, newest, changed=before != clean)
    await session.commit()
    return None if row.requested_action is None else JobAction(row.requested_action)


async def record_checkpoint(
    session: AsyncSession,
    job_id: int,
    worker_id: str,
    step: int,
    kind: CheckpointKind | str,
    path: str,
) -> Checkpoint:
    """Record saved weights; a `state` becomes the resume point, a `final` the result."""
    kind = CheckpointKind(kind)
    now = utcnow()
    values: dict[str, Any] = {"heartbeat_at": now}
    if kind is CheckpointKind.state:
        values.update(last_state_path=path, last_state_step=step)
    elif kind is CheckpointKind.final:
        values.update(final_weights_path=path)
    result = await session.execute(update(Job).where(*held(job_id, worker_id)).values(**values))
    if result.rowcount != 1:
        await session.rollback()
        raise JobNotHeld(f"job {job_id} is no longer held by {worker_id}")
    checkpoint = Checkpoint(job_id=job_id, step=step, kind=kind, path=path, created_at=now)
    session.add(checkpoint)
    await session.commit()
    return detach(session, checkpoint)
