"""Usage totals kept as steps are recorded: each step counted once however often it is
replayed (as its metric row is), on the job and on the day it was recorded."""

from __future__ import annotations

from datetime import date, timedelta

from sqlalchemy import select

from app.core.pricing import Price, PriceTable
from app.core.tables import utcnow
from app.jobs.rows import get_job
from app.jobs.store import claim_job
from app.records.store import record_eval, record_step
from app.usage.store import usage_rows
from app.usage.tables import UsageDay


def usage(sampled: int, teacher: int, trained: int, eval_tokens: int = 0) -> dict[str, float]:
    metrics = {
        "opd/reverse_kl_mean": 1.0,
        "usage/sampled_tokens": float(sampled),
        "usage/teacher_tokens": float(teacher),
        "usage/trained_tokens": float(trained),
    }
    return metrics | ({"usage/eval_tokens": float(eval_tokens)} if eval_tokens else {})


async def test_totals_count_each_step_once_across_a_replay(session, job):
    await claim_job(session, job.id, "w1", heartbeat_timeout=60)
    await record_step(session, job.id, "w1", 0, usage(10, 30, 29, eval_tokens=50))
    await record_step(session, job.id, "w1", 1, usage(12, 34, 33))
    # The worker crashed; the resumed run replays step 1 (here with other numbers).
    await record_step(session, job.id, "w1", 1, usage(11, 32, 31))
    await record_step(session, job.id, "w1", 2, usage(9, 28, 27))
    await record_eval(session, job.id, "w1", 3, {"usage/eval_tokens": 40.0})

    stored = await get_job(session, job.id)
    assert stored.usage.model_dump() == {
        "sampled_tokens": 10 + 11 + 9,
        "teacher_tokens": 30 + 32 + 28,
        "trained_tokens": 29 + 31 + 27,
        "eval_tokens": 50 + 40,
        "estimated_cost": None,
    }
    (day,) = (await session.execute(select(UsageDay).where(UsageDay.job_id == job.id))).scalars()
    assert (day.day, day.team_id) == (utcnow().date(), job.team_id)
    assert (day.sampled_tokens, day.teacher_tokens, day.trained_tokens, day.eval_tokens) == (
        30,
        90,
        87,
        90,
    )


async def test_a_step_without_usage_metrics_writes_no_usage(session, job):
    await claim_job(session, job.id, "w1", heartbeat_timeout=60)
    await record_step(session, job.id, "w1", 0, {"opd/reverse_kl_mean": 1.0})
    rows = await session.execute(select(UsageDay).where(UsageDay.job_id == job.id))
    assert rows.first() is None
    assert (await get_job(session, job.id)).sampled_tokens == 0


async def test_usage_rows_are_per_job_and_day_within_the_range(session, job):
    await claim_job(session, job.id, "w1", heartbeat_timeout=60)
    await record_step(session, job.id, "w1", 0, usage(5, 15, 14))
    today = utcnow().date()

    rows = await usage_rows(session, job.team_id, today, today)
    other_team = await usage_rows(session, job.team_id + 10_000, today, today)
    before = await usage_rows(session, job.team_id, date(2000, 1, 1), today - timedelta(days=1))

    assert [(r.job_id, r.day, r.backend, r.counts["sampled_tokens"]) for r in rows] == [
        (job.id, today, "local", 5)
    ]
    assert other_team == [] and before == []


def test_a_cost_is_estimated_only_from_prices_the_table_has():
    prices = PriceTable(
        [
            Price(backend="trio", model="student", sampled=2.0, trained=3.0, eval=1.0),
            Price(backend="trio", model="teacher", scored=0.5),
        ]
    )
    counts = {"sampled": 1_000_000, "teacher_tokens": 2_000_000, "trained": 500_000}

    assert prices.cost("trio", "student", "teacher", eval_tokens=0, **counts) == 2 + 1 + 1.5
    assert prices.cost("trio", "student", "unpriced", eval_tokens=0, **counts) is None
    assert prices.cost("local", "student", "teacher", eval_tokens=0, **counts) is None
    assert PriceTable([]).cost("trio", "student", "teacher", eval_tokens=0, **counts) is None
    nothing_used = dict.fromkeys(counts, 0)
    assert prices.cost("trio", "x", "y", eval_tokens=0, **nothing_used) == 0.0
