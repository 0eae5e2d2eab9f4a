"""The stored summaries always equal what the step rows give, replays and gaps included."""

from __future__ import annotations

import math
import random

from sqlalchemy import select

from app.curves.blocks import Summary, complete_blocks
from app.curves.tables import MetricSummary, StepMetric
from app.jobs.store import claim_job
from app.records.store import record_step


async def stored(session, job_id: int) -> dict[tuple[str, int, int], object]:
    rows = await session.execute(select(MetricSummary).where(MetricSummary.job_id == job_id))
    return {
        (r.key, r.width, r.block): Summary(*(getattr(r, name) for name in Summary._fields))
        for r in rows.scalars()
    }


async def from_step_rows(session, job_id: int) -> dict[tuple[str, int, int], object]:
    query = select(StepMetric.step, StepMetric.metrics).where(StepMetric.job_id == job_id)
    rows = [(step, metrics) for step, metrics in await session.execute(query.order_by("step"))]
    return {(b.key, b.width, b.index): b.summary for b in complete_blocks(rows)}


async def test_recording_steps_keeps_the_summaries_equal_to_the_rows(session, job):
    await claim_job(session, job.id, "w1", heartbeat_timeout=60)
    noise = random.Random(7)
    for step in range(70):
        metrics = {"kl": noise.gauss(1, 0.1), "loss": noise.random()}
        if step % 5 == 0:
            metrics["eval"] = math.nan if step == 10 else noise.random()
        await record_step(session, job.id, "w1", step, metrics)
    summaries = await stored(session, job.id)
    assert summaries == await from_step_rows(session, job.id)
    complete = {(4, b) for b in range(17)} | {(16, b) for b in range(4)} | {(64, 0)}
    assert {(width, block) for _, width, block in summaries} == complete, "69 is still open"
    evals = summaries["eval", 16, 0]
    assert evals.points == 4, "steps 0, 5, 10 and 15"
    assert 10 not in (evals.min_step, evals.max_step), "a NaN is never an extreme"


async def test_replays_that_change_values_or_drop_a_metric_are_summarised_again(session, job):
    await claim_job(session, job.id, "w1", heartbeat_timeout=60)
    for step in range(40):
        await record_step(session, job.id, "w1", step, {"kl": 1.0, "extra": 2.0})
    # a resumed run replays steps 20.. with other values (a non-deterministic backend)
    await record_step(session, job.id, "w1", 21, {"kl": 99.0})
    await record_step(session, job.id, "w1", 22, {"kl": -99.0, "extra": 2.0})
    await record_step(session, job.id, "w1", 23, {"kl": 1.0, "extra": 2.0})  # unchanged
    summaries = await stored(session, job.id)
    assert summaries == await from_step_rows(session, job.id)
    assert summaries["kl", 16, 1].max_value == 99.0 and summaries["kl", 16, 1].max_step == 21
    assert summaries["kl", 4, 5].min_step == 22
    assert summaries["extra", 4, 5].points == 3, "step 21 no longer has `extra`"


async def test_a_gap_filled_later_is_summarised_too(session, job):
    await claim_job(session, job.id, "w1", heartbeat_timeout=60)
    for step in [0, 1, 2, 3, 4, 5, 9, 10, 6, 7, 8, 20]:
        await record_step(session, job.id, "w1", step, {"kl": float(step)})
    summaries = await stored(session, job.id)
    assert summaries == await from_step_rows(session, job.id)
    assert summaries["kl", 4, 1].points == 4 and summaries["kl", 16, 0].points == 11
