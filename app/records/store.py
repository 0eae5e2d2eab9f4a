"""What a run reports, appended as it happens: step metrics, saved weights, timeline events.

A step's metrics are upserted on (job_id, step), so a step replayed after a crash
overwrites its row and the table holds each step once; the block summaries that charts
read follow in the same transaction (app/curves/block_store.py).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import delete, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from app.core.db import detach, insert_for
from app.core.tables import finite_or_none, utcnow
from app.curves.block_store import keep_summaries, step_probe
from app.curves.tables import StepMetric
from app.jobs.errors import JobNotHeld
from app.jobs.rows import event_row, held
from app.jobs.schemas import CheckpointKind, EventLevel, JobAction
from app.jobs.tables import Checkpoint, Event, Job
from app.jobs.webhook_events import add_eval_deliveries
from app.samples.tables import Sample
from app.sweeps.tables import Sweep
from app.usage.store import (
    PricedModels,
    add_usage_day,
    counter_increments,
    job_models,
    models_from,
    usage_change,
)
from kernel.samples import KeptSample
from kernel.summary import advance_ends


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


async def recorded_steps(
    session: AsyncSession, job_id: int, first: int, last: int
) -> list[tuple[int, dict[str, Any], datetime]]:
    """Steps first..last-1 of a job as recorded, with when (what a resumed attempt's MLflow
    mirror sends when a crash kept them from the tracker)."""
    rows = await session.execute(
        select(StepMetric.step, StepMetric.metrics, StepMetric.recorded_at)
        .where(StepMetric.job_id == job_id, StepMetric.step >= first, StepMetric.step < last)
        .order_by(StepMetric.step)
    )
    return [(step, metrics, recorded_at) for step, metrics, recorded_at in rows.all()]


async def record_mlflow_run(session: AsyncSession, job_id: int, run_id: str) -> None:
    """Keep the MLflow run a job is mirrored into, for its later attempts (the first kept
    stays)."""
    await session.execute(
        update(Job)
        .where(Job.id == job_id, Job.mlflow_run_id.is_(None))
        .values(mlflow_run_id=run_id)
    )
    await session.commit()


def upsert_metrics(
    dialect: str, job_id: int, step: int, metrics: dict[str, Any], now: datetime
) -> Any:
    """INSERT .. ON CONFLICT (job_id, step) DO UPDATE, spelled for the session's database."""
    statement = insert_for(dialect)(StepMetric).values(
        job_id=job_id, step=step, metrics=metrics, recorded_at=now
    )
    return statement.on_conflict_do_update(
        index_elements=["job_id", "step"],
        set_={"metrics": statement.excluded.metrics, "recorded_at": statement.excluded.recorded_at},
    )


class Found(NamedTuple):
    """What the statement that advances the job found before a step's metrics are written."""

    newest: int | None  # the job's newest recorded step
    metrics: dict[str, float | None] | None  # what this step held (None: not recorded)
    ends: dict[str, list[float | None]] | None  # the job's summary points
    team_id: int
    sweep_metric: str | None  # a trial's sweep's metric, kept in `ends` too
    backend: str
    student: str
    teacher: str
    teachers: Any

    @property
    def models(self) -> PricedModels:
        """What the step's tokens are priced at."""
        return models_from(self.backend, self.student, self.teacher, self.teachers)


def found_before(job_id: int, step: int) -> tuple[Any, ...]:
    """The RETURNING columns that make a `Found`: no extra round trip to read them."""
    sweep_metric = (
        select(Sweep.definition[("metric", "name")].as_string())
        .where(Sweep.id == Job.sweep_id)
        .scalar_subquery()
    )
    return (*step_probe(job_id, step), Job.metric_ends, Job.team_id, sweep_metric, *job_models())


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
        .returning(Job.requested_action, *found_before(job_id, step))
    )
    row = result.one_or_none()
    if row is None:
        await session.rollback()
        raise JobNotHeld(f"job {job_id} is no longer held by {worker_id}")
    await store_metrics(session, job_id, step, metrics, now, Found(*row[1:]))
    await session.commit()
    return None if row.requested_action is None else JobAction(row.requested_action)


async def record_eval(
    session: AsyncSession, job_id: int, worker_id: str, step: int, metrics: dict[str, float]
) -> None:
    """Store the held-out eval after the run's last step as the metrics of step `step`
    (= the run's steps, which no training step has); progress is left as it is, but
    `updated_at` moves: the job's curves changed (their ETag is made from it). The first
    time, the team's webhooks get `job.eval_completed` (same transaction)."""
    now = utcnow()
    result = await session.execute(
        update(Job)
        .where(*held(job_id, worker_id))
        .values(heartbeat_at=now, updated_at=now)
        .returning(*found_before(job_id, step))
    )
    row = result.one_or_none()
    if row is None:
        await session.rollback()
        raise JobNotHeld(f"job {job_id} is no longer held by {worker_id}")
    found = Found(*row)
    await store_metrics(session, job_id, step, metrics, now, found)
    if found.metrics is None:  # a replayed eval was announced already
        await add_eval_deliveries(session, found.team_id, job_id, step, metrics, now)
    await session.commit()


async def store_metrics(
    session: AsyncSession,
    job_id: int,
    step: int,
    metrics: dict[str, float],
    now: datetime,
    found: Found,
) -> None:
    """Upsert step `step`'s row and keep what is derived from it (the summaries charts
    read, the job's summary points and usage totals, today's usage), in the caller's
    transaction: one more write to the job row, whatever changed on it."""
    clean = {name: finite_or_none(value) for name, value in metrics.items()}
    dialect = (await session.connection()).dialect.name
    await session.execute(upsert_metrics(dialect, job_id, step, clean, now))
    await keep_summaries(session, job_id, step, found.newest, changed=found.metrics != clean)
    change = usage_change(clean, found.metrics)
    values = counter_increments(change)
    ends = advance_ends(found.ends or {}, step, clean, found.sweep_metric)
    if ends != (found.ends or {}):
        values["metric_ends"] = ends
    if values:
        await session.execute(update(Job).where(Job.id == job_id).values(values))
    if change:
        await add_usage_day(session, dialect, job_id, found.team_id, change, now, found.models)


def printable(text: str) -> str:
    """What a model wrote, storable anywhere: Postgres text holds no NUL, shown as ␀."""
    return text.replace("\x00", "\u2400")


async def record_samples(
    session: AsyncSession, job_id: int, worker_id: str, step: int, samples: list[KeptSample]
) -> None:
    """Keep a step's rollouts; a replayed step overwrites the ones it kept before."""
    result = await session.execute(
        update(Job).where(*held(job_id, worker_id)).values(heartbeat_at=utcnow())
    )
    if result.rowcount != 1:
        await session.rollback()
        raise JobNotHeld(f"job {job_id} is no longer held by {worker_id}")
    await session.execute(delete(Sample).where(Sample.job_id == job_id, Sample.step == step))
    now = utcnow()
    session.add_all(
        Sample(
            job_id=job_id,
            step=step,
            position=position,
            prompt=printable(sample.prompt),
            completion=printable(sample.completion),
            tokens=[printable(token) for token in sample.tokens],
            reverse_kl=[finite_or_none(v) for v in sample.reverse_kl],
            truncated=sample.truncated,
            created_at=now,
        )
        for position, sample in enumerate(samples)
    )
    await session.commit()


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


async def sampler_weights(session: AsyncSession, job_id: int, steps: set[int]) -> dict[int, str]:
    """The sampler weights the job recorded after each of `steps` (the latest of a step):
    a job resumed with loop.max_steps_off_policy samples from them again."""
    rows = await session.execute(
        select(Checkpoint.step, Checkpoint.path)
        .where(
            Checkpoint.job_id == job_id,
            Checkpoint.kind == CheckpointKind.sampler,
            Checkpoint.step.in_(sorted(steps)),
        )
        .order_by(Checkpoint.id)
    )
    return dict(rows.tuples().all())
