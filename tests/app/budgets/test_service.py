"""Budgets enforced in the database (SQLite and Postgres): a team's spend is what its
steps recorded this period (a replayed step counts once), the hard limit pauses its running
and queued jobs with an event saying why, the soft threshold warns once a period, and what
the budget paused resumes when it is raised, removed, or the period turns."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select

from app.budgets.errors import BudgetExceeded, BudgetRefused
from app.budgets.rules import BUDGET_STOP, Limit, Period
from app.budgets.schemas import BudgetUpdate
from app.budgets.service import (
    HOLD_MARGIN_SECONDS,
    admit_spending,
    budget_public,
    check_spending,
    hold_spending,
    let_go,
    resume_spending,
    set_budget,
    standing,
)
from app.budgets.store import put_budget
from app.core.idempotency import Idempotency
from app.core.pricing import Price, PriceTable
from app.core.tables import utcnow
from app.jobs.rows import get_job
from app.jobs.schemas import JobAction, JobStatus
from app.jobs.store import claim_job, create_job
from app.jobs.tables import Event
from app.records.store import record_step
from app.usage.store import PricedModels
from app.webhooks.tables import Webhook, WebhookDelivery
from kernel.spec import JobSpec
from tests.app.conftest import small_spec
from tests.app.usage.test_store import usage

NO_PRICES = PriceTable([])
PRICES = PriceTable(
    [
        Price(backend="local", model="Qwen/Qwen3.5-4B", sampled=1.0, trained=1.0, eval=1.0),
        Price(backend="local", model="Qwen/Qwen3.6-27B", scored=2.0),
    ]
)


async def running_job(session, team_id: int, worker: str = "w1"):
    job = (await create_job(session, team_id, JobSpec.model_validate(small_spec()))).job
    await claim_job(session, job.id, worker, heartbeat_timeout=60)
    return job


async def test_spend_is_what_the_steps_recorded_a_replay_counted_once(session, key):
    team = key.team.id
    await put_budget(session, team, Limit(tokens=1000, cost=None), utcnow())
    job = await running_job(session, team)
    await record_step(session, job.id, "w1", 0, usage(10, 20, 30))
    await record_step(session, job.id, "w1", 0, usage(10, 20, 30))  # replayed after a crash
    await record_step(session, job.id, "w1", 1, usage(1, 2, 3))

    found = await standing(session, team, NO_PRICES, utcnow())
    assert found is not None
    assert found.spend.tokens == 60 + 6
    assert not found.exhausted


async def test_the_hard_limit_pauses_the_teams_jobs_and_no_other_teams(session, key, make_key):
    team, other = key.team.id, (await make_key()).team.id
    await put_budget(session, team, Limit(tokens=100, cost=None), utcnow())
    crossing = await running_job(session, team, "w1")
    beside = await running_job(session, team, "w2")
    queued = (await create_job(session, team, JobSpec.model_validate(small_spec()))).job
    stranger = await running_job(session, other, "w3")
    await record_step(session, crossing.id, "w1", 0, usage(40, 40, 40))

    verdict = await check_spending(session, team, NO_PRICES, utcnow())

    assert verdict.budgeted and verdict.action is JobAction.pause
    for job_id, status in (
        (crossing.id, JobStatus.pausing),
        (beside.id, JobStatus.pausing),
        (queued.id, JobStatus.paused),
    ):
        stored = await get_job(session, job_id)
        assert (stored.status, stored.stop_reason) == (status, BUDGET_STOP)
    assert (await get_job(session, beside.id)).requested_action == JobAction.pause
    assert (await get_job(session, stranger.id)).status == JobStatus.running
    message = (
        await session.execute(
            select(Event.message).where(Event.job_id == beside.id).order_by(Event.id.desc())
        )
    ).scalar()
    assert "Pausing at the next step boundary" in message and "120 tokens of its 100" in message


async def test_a_team_without_a_budget_is_not_checked(session, key):
    verdict = await check_spending(session, key.team.id, NO_PRICES, utcnow())
    assert not verdict.budgeted and verdict.action is None


async def test_the_soft_threshold_sends_one_budget_threshold_delivery(session, key):
    team = key.team.id
    hook = Webhook(
        team_id=team,
        url="https://hooks.example.com/x",
        events=["budget.threshold"],
        secret="s" * 32,
    )
    session.add(hook)
    await session.commit()
    await put_budget(session, team, Limit(tokens=100, cost=None, soft=0.5), utcnow())
    job = await running_job(session, team)
    await record_step(session, job.id, "w1", 0, usage(20, 20, 20))
    for _ in range(3):  # three workers' checks, or one's repeated after a crash
        assert (await check_spending(session, team, NO_PRICES, utcnow())).action is None

    deliveries = list(
        (
            await session.execute(  # this test's webhook's: the database is the session's
                select(WebhookDelivery.event, WebhookDelivery.payload).where(
                    WebhookDelivery.webhook_id == hook.id
                )
            )
        ).all()
    )
    assert [event for event, _ in deliveries] == ["budget.threshold"]
    data = deliveries[0][1]["data"]
    assert (data["unit"], data["budget"], data["spent"], data["soft"]) == ("tokens", 100, 60, 0.5)


async def test_doors_refuse_at_the_limit_and_a_replay_passes(session, key):
    team = key.team.id
    spec = JobSpec.model_validate(small_spec())
    await put_budget(session, team, Limit(tokens=10, cost=None), utcnow())
    answered = Idempotency("retried", "POST /v1/jobs", {"name": "x"})
    await create_job(session, team, spec, answered)
    job = await running_job(session, team)
    await record_step(session, job.id, "w1", 0, usage(5, 5, 5))

    with pytest.raises(BudgetExceeded, match="spent 15 tokens of its 10 tokens budget"):
        await admit_spending(session, team, spec, NO_PRICES, utcnow())
    with pytest.raises(BudgetExceeded):
        await admit_spending(session, team, spec, NO_PRICES, utcnow(), "a new key")
    await admit_spending(session, team, spec, NO_PRICES, utcnow(), "retried")


async def test_a_cost_budget_refuses_a_spec_it_cannot_price(session, key, queue):
    team = key.team.id
    with pytest.raises(BudgetRefused, match="price table"):
        await set_budget(session, queue, team, BudgetUpdate(cost=5.0), NO_PRICES, utcnow())
    await set_budget(session, queue, team, BudgetUpdate(cost=5.0), PRICES, utcnow())
    unpriced = JobSpec.model_validate(small_spec(student={"base_model": "Qwen/Qwen3-0.6B"}))
    with pytest.raises(BudgetRefused, match="no price"):
        await admit_spending(session, team, unpriced, PRICES, utcnow())


async def test_raising_the_budget_resumes_what_it_paused(session, key, queue):
    team = key.team.id
    await set_budget(session, queue, team, BudgetUpdate(tokens=50), NO_PRICES, utcnow())
    job = await running_job(session, team)
    queued = (await create_job(session, team, JobSpec.model_validate(small_spec()))).job
    await record_step(session, job.id, "w1", 0, usage(20, 20, 20))
    await check_spending(session, team, NO_PRICES, utcnow())

    budget = await set_budget(session, queue, team, BudgetUpdate(tokens=500), NO_PRICES, utcnow())

    assert budget.state == "ok" and budget.spent.tokens == 60 and budget.left == 440
    running, resumed = await get_job(session, job.id), await get_job(session, queued.id)
    assert (running.status, running.stop_reason, running.requested_action) == (
        JobStatus.running,
        None,
        None,
    )
    assert (resumed.status, resumed.stop_reason) == (JobStatus.queued, None)


async def test_the_period_turning_resumes_what_the_budget_paused(session, key, queue):
    team = key.team.id
    now = datetime(2026, 12, 31, 23, 0, tzinfo=UTC)
    await put_budget(session, team, Limit(tokens=10, cost=None, period=Period.day), now)
    queued = (await create_job(session, team, JobSpec.model_validate(small_spec()))).job
    job = await running_job(session, team)
    await record_step(session, job.id, "w1", 0, usage(5, 5, 5))
    today = utcnow()
    await check_spending(session, team, NO_PRICES, today)
    assert (await get_job(session, queued.id)).status == JobStatus.paused

    assert await resume_spending(session, queue, NO_PRICES, today) == []
    tomorrow = today + timedelta(days=1)
    assert queued.id in await resume_spending(session, queue, NO_PRICES, tomorrow)
    assert (await get_job(session, queued.id)).status == JobStatus.queued


async def test_the_budget_page_shows_spend_per_day(session, key):
    team = key.team.id
    await put_budget(session, team, Limit(tokens=100, cost=None, soft=0.5), utcnow())
    job = await running_job(session, team)
    await record_step(session, job.id, "w1", 0, usage(20, 20, 20))
    budget = await budget_public(session, team, PRICES, utcnow())
    assert budget is not None
    assert budget.state == "soft" and budget.fraction == pytest.approx(0.6)
    assert [(d.day, d.tokens, d.cost) for d in budget.days] == [
        (utcnow().date(), 60, pytest.approx((20 + 2 * 20 + 20) / 1e6))
    ]


async def test_a_request_holds_its_most_until_it_lets_go_or_its_hold_expires(session, key):
    """What requests under way hold counts against the budget beside what was spent: a
    request whose most does not fit is refused saying so, and a hold whose process died
    (past its wait and a margin) holds nothing."""
    team, now = key.team.id, utcnow()
    await put_budget(session, team, Limit(tokens=100, cost=None), now)
    models = PricedModels("local", "Qwen/Qwen3.5-4B", "Qwen/Qwen3.6-27B")

    async def hold(tokens: int, at: datetime) -> int | None:
        most = {"sampled_tokens": tokens}
        return await hold_spending(session, team, most, models, NO_PRICES, at, 10)

    first = await hold(60, now)
    assert first is not None
    page = await budget_public(session, team, NO_PRICES, now)
    assert page is not None and (page.held, page.left, page.used) == (60, 40, 0)
    with pytest.raises(BudgetExceeded, match=r"may use up to 50 tokens.* 40 tokens left"):
        await hold(50, now)
    assert await hold(40, now) is not None  # exactly what is left
    later = now + timedelta(seconds=10 + HOLD_MARGIN_SECONDS + 1)
    assert await hold(100, later) is not None  # the others' processes died
    await let_go(session, first)
    with pytest.raises(BudgetExceeded):
        await hold(1, later)
