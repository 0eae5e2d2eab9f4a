"""What a run reports: each step once, however often it is replayed."""

from __future__ import annotations

import math

from sqlalchemy import func, select

from app.models import StepMetric
from app.store.jobs import claim_job
from app.store.records import record_step
from app.store.rows import get_job


async def test_a_replayed_step_overwrites_and_never_duplicates(session, job):
    await claim_job(session, job.id, "w1", heartbeat_timeout=60)
    await record_step(session, job.id, "w1", 0, {"a": 1.0, "b": 2.0})
    await record_step(session, job.id, "w1", 1, {"a": 1.5})
    await record_step(session, job.id, "w1", 0, {"a": 3.0, "c": math.nan})
    rows = (
        await session.execute(
            select(StepMetric.step, StepMetric.metrics)
            .where(StepMetric.job_id == job.id)
            .order_by(StepMetric.step)
        )
    ).all()
    assert [tuple(row) for row in rows] == [(0, {"a": 3.0, "c": None}), (1, {"a": 1.5})]
    assert (await get_job(session, job.id)).steps_done == 1, "progress follows the replay"


async def test_metric_rows_count_equals_steps(session, job):
    await claim_job(session, job.id, "w1", heartbeat_timeout=60)
    for step in [0, 1, 2, 1, 2]:
        await record_step(session, job.id, "w1", step, {"m": float(step)})
    count = (
        await session.execute(
            select(func.count()).select_from(StepMetric).where(StepMetric.job_id == job.id)
        )
    ).scalar()
    assert count == 3
