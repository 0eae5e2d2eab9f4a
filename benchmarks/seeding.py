"""Filling a database in bulk with what real runs would have left in it: a job's step rows
under the real metric names, the block summaries and summary points that recording them one
by one keeps, and sweeps whose trials are such jobs; then running on those trials as their
workers would. (Scripts run from this folder and import it as `seeding`.)"""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.synchronize import Event as StopEvent
from pathlib import Path
from typing import Any

import yaml
from psycopg import sql
from sqlalchemy import insert, update
from sqlalchemy.ext.asyncio import AsyncSession

from app.core.db import create_db_engine, session_factory
from app.core.tables import finite_or_none, utcnow
from app.curves.blocks import complete_blocks
from app.curves.tables import MetricSummary, StepMetric
from app.jobs.schemas import ACTIVE_STATUSES, JobAction, JobStatus
from app.jobs.store import complete_job, stop_job
from app.jobs.tables import Job
from app.records.store import record_step
from app.sweeps.schemas import SweepCreate
from app.sweeps.search import suggest, trial_spec
from app.sweeps.store import create_sweep
from app.sweeps.tables import Sweep
from kernel.spec import JobSpec
from kernel.summary import advance_ends

ROOT = Path(__file__).resolve().parents[1]
TINY_SPEC = ROOT / "examples" / "tiny.yaml"
INSERT_BATCH = 5_000
SEEDER = "benchmark-seeder"
SWEEP_METRIC = "opd/reverse_kl_mean"
METRIC_NAMES = (  # what a local job records each step (docs/algorithm.md#metrics): 14 names
    "data/datums",
    "data/completion_tokens_mean",
    "data/completion_tokens_total",
    "data/completion_tokens_per_second",
    "opd/reverse_kl_mean",
    "opd/reverse_kl_std",
    "train/learning_rate",
    "train/step",
    "time/step_elapsed_time",
    "trainer/loss_sum",
    "trainer/loss_mean",
    "trainer/token_count",
    "trainer/grad_norm",
    "trainer/learning_rate",
)
Metrics = Callable[[int], dict[str, float]]


def metrics_at(step: int, names: tuple[str, ...] = METRIC_NAMES, seed: int = 0) -> dict[str, float]:
    """A step's metrics under the real names: slowly falling, noisy, a spike now and then;
    `seed` > 0 scales the fall, so each trial of a sweep learns at its own pace."""
    noise = random.Random(step + 1_000_003 * seed)
    spike = 25.0 if noise.random() < 0.001 else 0.0
    pace = 1.0 + (seed % 97) / 97
    return {name: pace * 2.0 / math.log(step + 3) + noise.uniform(0, 0.2) + spike for name in names}


async def fill(
    session: AsyncSession,
    job_id: int,
    steps: int,
    metrics: Metrics = metrics_at,
    also: str | None = None,
) -> None:
    """Record `steps` steps in bulk: the step rows, and the summaries and summary points
    recording them one by one leaves (the same function builds them in migration 0002;
    `also`: a trial's sweep metric, kept as record_step keeps it)."""
    rows = [
        (step, {k: finite_or_none(v) for k, v in metrics(step).items()}) for step in range(steps)
    ]
    now = utcnow()
    steps_rows = [
        {"job_id": job_id, "step": step, "metrics": values, "recorded_at": now}
        for step, values in rows
    ]
    await bulk_insert(session, StepMetric, steps_rows)
    await bulk_insert(
        session, MetricSummary, [block.row(job_id) for block in complete_blocks(rows)]
    )
    ends: Mapping[str, list[float | None]] = {}
    for step, values in rows:
        ends = advance_ends(ends, step, values, also)
    done = update(Job).where(Job.id == job_id)
    await session.execute(done.values(steps_done=steps, metric_ends=ends))
    await session.commit()


async def bulk_insert(session: AsyncSession, table: type[Any], rows: list[dict[str, Any]]) -> None:
    """INSERT the rows; on Postgres with COPY (a sweep's trials hold millions of rows)."""
    if not rows:
        return
    connection = await session.connection()
    if connection.dialect.name != "postgresql":
        for start in range(0, len(rows), INSERT_BATCH):
            await session.execute(insert(table), rows[start : start + INSERT_BATCH])
        return
    columns = list(rows[0])
    json_columns = {name for name in columns if isinstance(rows[0][name], dict)}
    records = [
        tuple(json.dumps(row[name]) if name in json_columns else row[name] for name in columns)
        for row in rows
    ]
    raw = (await connection.get_raw_connection()).driver_connection
    assert raw is not None
    copy = sql.SQL("COPY {} ({}) FROM STDIN").format(
        sql.Identifier(table.__tablename__), sql.SQL(", ").join(map(sql.Identifier, columns))
    )
    async with raw.cursor() as cursor, cursor.copy(copy) as writer:
        for record in records:
            await writer.write_row(record)


def sweep_definition(
    name: str, trials: int, steps: int, min_steps: int, parallel: int = 64
) -> SweepCreate:
    """A random search over the tiny job's learning rate, ASHA from `min_steps` (eta 3),
    judged on the reverse KL."""
    base = yaml.safe_load(TINY_SPEC.read_text())
    base["loop"]["steps"] = steps
    return SweepCreate.model_validate(
        {
            "name": name,
            "base": base,
            "parameters": {
                "optim.learning_rate": {"min": 1e-4, "max": 1e-2, "distribution": "log_uniform"}
            },
            "method": "random",
            "metric": {"name": SWEEP_METRIC, "goal": "minimize"},
            "max_trials": trials,
            "parallel": parallel,
            "early_stop": {"type": "asha", "min_steps": min_steps, "eta": 3},
        }
    )


async def seed_sweep(
    session: AsyncSession,
    team_id: int,
    definition: SweepCreate,
    progress: Callable[[int], tuple[JobStatus, int]],
    worker_id: str,
    names: tuple[str, ...] = METRIC_NAMES,
) -> tuple[int, list[int]]:
    """A running sweep with all its planned trials, trial n `progress(n)` = (status, steps
    recorded); running ones held by `worker_id`. The sweep is leased to SEEDER (no
    controller takes it) until `release` is called. Returns the sweep's and trials' ids."""
    sweep, _ = await create_sweep(session, team_id, definition)
    now = utcnow()
    await session.execute(
        update(Sweep)
        .where(Sweep.id == sweep.id)
        .values(lease_owner=SEEDER, lease_until=now + timedelta(days=1))
    )
    assert definition.base is not None and sweep.id is not None
    job_ids = []
    for number in range(1, definition.max_trials + 1):
        spec = JobSpec.model_validate(
            trial_spec(definition.base, suggest(definition, number, []), f"trial-{number}")
        )
        status, steps = progress(number)
        row: dict[str, Any] = {
            "team_id": team_id,
            "name": spec.name,
            "status": status,
            "spec": spec.model_dump(mode="json"),
            "created_at": now,
            "updated_at": now,
            "queued_at": now,
            "started_at": now,
            "finished_at": None if status == JobStatus.running else now,
            "attempts": 1,
            "total_steps": spec.loop.steps,
            "heartbeat_at": now,
            "worker_id": worker_id,
            "sweep_id": sweep.id,
            "sweep_trial": number,
        }
        job_id = (await session.execute(insert(Job).values(row).returning(Job.id))).scalar_one()
        await fill(
            session,
            job_id,
            steps,
            lambda step, n=number: metrics_at(step, names, n),
            definition.metric.name,
        )
        job_ids.append(job_id)
    return sweep.id, job_ids


async def release(session: AsyncSession, sweep_ids: list[int]) -> None:
    """Hand seeded sweeps to the controllers."""
    await session.execute(
        update(Sweep).where(Sweep.id.in_(sweep_ids)).values(lease_owner=None, lease_until=None)
    )
    await session.commit()


@dataclass
class Trial:
    """A seeded trial the writer runs on: its sweep's trial number and next step."""

    number: int
    step: int
    total: int


@dataclass
class TrialWriter:
    """Runs on seeded trials as their workers would: records their next steps through
    record_step, `per_second` steps a second in turn; beats for every trial it holds every
    `beat_seconds` (one statement); ends a trial that was asked to stop (early stopping's
    cancel) at its step boundary, and one that recorded its last step as succeeded."""

    url: str
    trials: dict[int, Trial]
    worker_id: str
    names: tuple[str, ...]
    per_second: float
    beat_seconds: float

    def write(self, stop: StopEvent) -> dict[str, int]:
        """Until `stop` is set or every trial ended (a child process's work)."""
        return asyncio.run(self.run(stop))

    async def run(self, stop: StopEvent) -> dict[str, int]:
        engine = create_db_engine(self.url)
        sessions = session_factory(engine)
        running = dict(self.trials)
        written = stopped = completed = 0
        began = next_beat = time.perf_counter()
        try:
            while running and not stop.is_set():
                async with sessions() as session:
                    if time.perf_counter() >= next_beat:
                        await self.beat(session)
                        next_beat = time.perf_counter() + self.beat_seconds
                    job_id, trial = next(iter(running.items()))
                    del running[job_id]
                    values = metrics_at(trial.step, self.names, trial.number)
                    action = await record_step(session, job_id, self.worker_id, trial.step, values)
                    written += 1
                    if action is JobAction.cancel:
                        await stop_job(session, job_id, self.worker_id, reason="stopped")
                        stopped += 1
                    elif trial.step + 1 == trial.total:
                        await complete_job(session, job_id, self.worker_id, "weights")
                        completed += 1
                    else:
                        running[job_id] = Trial(trial.number, trial.step + 1, trial.total)
                pause = began + written / self.per_second - time.perf_counter()
                await asyncio.sleep(max(0.0, pause))
        finally:
            await engine.dispose()
        return {"steps_written": written, "trials_stopped": stopped, "trials_completed": completed}

    async def beat(self, session: AsyncSession) -> None:
        await session.execute(
            update(Job)
            .where(Job.worker_id == self.worker_id, Job.status.in_(ACTIVE_STATUSES))
            .values(heartbeat_at=utcnow())
        )
        await session.commit()
