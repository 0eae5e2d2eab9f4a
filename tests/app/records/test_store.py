"""What a run reports: each step once, however often it is replayed."""

from __future__ import annotations

import math

import pytest
from sqlalchemy import func, select

from app.curves.tables import StepMetric
from app.jobs.errors import JobNotHeld
from app.jobs.rows import get_job
from app.jobs.store import claim_job
from app.records.store import record_eval, record_samples, record_step
from app.samples.tables import Sample
from kernel.samples import KeptSample

KL = "opd/reverse_kl_mean"


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


async def test_the_final_eval_is_a_row_of_its_own_and_leaves_progress_alone(session, job):
    await claim_job(session, job.id, "w1", heartbeat_timeout=60)
    for step in range(3):
        await record_step(session, job.id, "w1", step, {KL: 2.0 - step / 2})
    await record_eval(session, job.id, "w1", 3, {"eval/accuracy": 0.5, "time/eval": 0.1})
    rows = dict(
        (
            await session.execute(
                select(StepMetric.step, StepMetric.metrics).where(StepMetric.job_id == job.id)
            )
        ).all()
    )
    assert rows[3] == {"eval/accuracy": 0.5, "time/eval": 0.1}
    done = await get_job(session, job.id)
    assert done.steps_done == 3
    assert done.summary.eval_accuracy.last == 0.5
    assert (done.summary.reverse_kl.first, done.summary.reverse_kl.last) == (2.0, 1.0)


async def test_kept_samples_are_stored_and_a_replay_replaces_them(session, job):
    await claim_job(session, job.id, "w1", heartbeat_timeout=60)
    first = [KeptSample("Q?", "ab", ["a", "b"], [0.5, math.inf])]
    await record_samples(session, job.id, "w1", 4, first)
    replay = [KeptSample("Q?", "cd", ["c", "d"], [0.1, 0.2]), KeptSample("R?", "e", ["e"], [1.0])]
    await record_samples(session, job.id, "w1", 4, replay)
    rows = (
        await session.execute(select(Sample).where(Sample.job_id == job.id).order_by(Sample.id))
    ).scalars()
    assert [(s.step, s.position, s.completion, s.reverse_kl) for s in rows] == [
        (4, 0, "cd", [0.1, 0.2]),
        (4, 1, "e", [1.0]),
    ]
    with pytest.raises(JobNotHeld):
        await record_samples(session, job.id, "w2", 5, first)
