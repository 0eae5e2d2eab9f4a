"""A team's budget enforced where spending happens, by whoever is there: the doors that
start spending (a job, a clone, a sweep, a completion) refuse when it is spent; a worker
checks after each step it records, pauses the team's jobs at the hard limit and warns
once past the soft one; an admin raising it, or the requeuer once the period turned,
resumes the jobs it paused. Everything is read from and written to the database, so
every API process and worker agrees, and a process killed between two writes leaves a
state the next check completes.

A team never spends more than its limit plus one step per running job: a worker waits
for its step's record and this check before it takes the next step
(worker/service/db_sink.py), so a job starts a step only while its team is under the
limit as recorded, and every step before it is recorded. A request served from a job's
weights (a completion, a playground call) spends nothing past it: it holds its most
before it starts (`hold_spending`, under the team's lock, so two API processes cannot
both take what is left), and its usage replaces the hold once recorded.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from app.auth.tables import Team
from app.budgets.errors import BudgetExceeded, BudgetRefused
from app.budgets.rules import (
    BUDGET_STOP,
    Limit,
    Spend,
    amount_text,
    asked_message,
    exceeded_message,
    exhausted,
    left,
    past_soft,
    period_end,
    period_of,
    plus,
    used,
)
from app.budgets.schemas import BudgetPublic, BudgetUpdate, SpendDay, SpendPublic
from app.budgets.store import (
    add_hold,
    budget_of,
    delete_budget,
    drop_hold,
    holds_of,
    limit_of,
    mark_warned,
    priced,
    put_budget,
    spend_by_day,
    total,
)
from app.budgets.tables import TeamBudget
from app.core.db import detach, lock_team
from app.core.pricing import PriceTable
from app.core.queue import JobQueue
from app.jobs.dispatch import enqueue_job
from app.jobs.schemas import JobAction, JobStatus
from app.jobs.store import compare_and_set
from app.jobs.tables import Job
from app.jobs.transitions import Plan
from app.usage.store import PricedModels, models_of
from app.webhooks.outbox import add_deliveries
from app.webhooks.schemas import WebhookEvent
from kernel.spec import JobSpec

MAX_JOBS_A_PASS = 1000
"""Jobs one pass pauses or resumes for a team; the next pass takes the rest."""
LOCKS = 47_004
"""The first key of the budgets' advisory locks (the second: the team)."""
HOLD_MARGIN_SECONDS = 60
"""How long a hold outlives its request's wait: past it, a process that died holds nothing."""


@dataclass(frozen=True)
class Standing:
    """Where a team stands against its budget this period."""

    team_id: int
    team: str
    limit: Limit
    start: date
    end: datetime
    days: dict[date, Spend]
    held: Spend = field(default_factory=Spend)
    """What requests under way hold (their most), not yet spent."""

    @property
    def spend(self) -> Spend:
        return total(self.days)

    @property
    def committed(self) -> Spend:
        """What was spent and what requests under way hold."""
        return plus(self.spend, self.held)

    @property
    def exhausted(self) -> bool:
        return exhausted(self.limit, self.committed)

    def figures(self) -> dict[str, Any]:
        """What a webhook event or a job's event says of it."""
        return {
            "team_id": self.team_id,
            "team": self.team,
            "unit": self.limit.unit,
            "budget": self.limit.amount,
            "spent": used(self.limit, self.spend),
            "soft": self.limit.soft,
            "period": self.limit.period.value,
            "period_start": self.start.isoformat(),
            "period_end": self.end.isoformat(),
        }


async def standing(
    session: AsyncSession, team_id: int, prices: PriceTable, now: datetime
) -> Standing | None:
    """The team's standing now; None when it has no budget."""
    row = (
        await session.execute(
            select(TeamBudget, Team.name)
            .join(Team, Team.id == TeamBudget.team_id)
            .where(TeamBudget.team_id == team_id)
            .execution_options(populate_existing=True)
        )
    ).one_or_none()
    if row is None:
        return None
    budget, name = row
    limit = limit_of(budget)
    start, end = period_of(limit.period, now)
    days = await spend_by_day(session, team_id, start, end, prices)
    held = await holds_of(session, team_id, now)
    return Standing(team_id, name, limit, start, period_end(limit.period, now), days, held)


async def hold_spending(
    session: AsyncSession,
    team_id: int,
    most: Mapping[str, int],
    models: PricedModels,
    prices: PriceTable,
    now: datetime,
    seconds: float,
) -> int | None:
    """Hold the most a request may spend (`most`: usage counters at the job's `models`)
    before it starts, for its wait of `seconds` and a margin: under the team's lock
    (Postgres; SQLite's one writer), so that requests racing in several API processes
    never hold more than is left. BudgetExceeded when it does not fit beside what was
    spent and what requests under way hold; None (nothing held) without a budget. The
    hold's id goes to `settle` (where its usage is recorded) or `let_go`."""
    await session.rollback()  # a transaction of its own, whose first write is the hold
    if await budget_of(session, team_id) is None:
        await session.rollback()
        return None
    await session.rollback()
    asked = priced(prices, models, most)
    hold_id = await add_hold(
        session, team_id, asked, now + timedelta(seconds=seconds + HOLD_MARGIN_SECONDS), now
    )
    await lock_team(session, LOCKS, team_id)
    found = await standing(session, team_id, prices, now)
    if found is None:  # its budget was removed meanwhile
        await session.rollback()
        return None
    if used(found.limit, found.committed) <= found.limit.amount:
        await session.commit()
        return hold_id
    await session.rollback()
    others = Spend(found.held.tokens - asked.tokens, found.held.cost - asked.cost)
    why = (
        None
        if exhausted(found.limit, plus(found.spend, others))
        else asked_message(found.team, found.limit, found.spend, others, asked)
    )
    raise BudgetExceeded(found.team, found.limit, found.spend, found.end, why)


async def fits(
    session: AsyncSession,
    team_id: int,
    counts: Mapping[str, int],
    models: PricedModels,
    prices: PriceTable,
    now: datetime,
) -> bool:
    """Whether usage `counts` at `models` (a job's eval, a unit its worker starts as it
    starts a step) fits what the team may still spend beside what requests hold."""
    found = await standing(session, team_id, prices, now)
    await session.rollback()
    if found is None:
        return True
    asked = priced(prices, models, counts)
    return used(found.limit, plus(found.committed, asked)) <= found.limit.amount


async def settle(session: AsyncSession, hold_id: int | None) -> None:
    """Let go of a hold in the caller's transaction, which records the request's usage."""
    if hold_id is not None:
        await drop_hold(session, hold_id)


async def let_go(session: AsyncSession, hold_id: int | None) -> None:
    """Let go of a hold whose request ended with nothing to record."""
    if hold_id is not None:
        await session.rollback()
        await drop_hold(session, hold_id)
        await session.commit()


async def refuse_if_exhausted(
    session: AsyncSession, team_id: int, prices: PriceTable, now: datetime
) -> None:
    """BudgetExceeded when the team reached its hard limit: what every door that starts
    spending without a new job (a sweep, a completion) asks first."""
    found = await standing(session, team_id, prices, now)
    await session.rollback()
    if found is not None and found.exhausted:
        raise BudgetExceeded(found.team, found.limit, found.spend, found.end)


async def admit_spending(
    session: AsyncSession,
    team_id: int,
    spec: JobSpec,
    prices: PriceTable,
    now: datetime,
    idempotency_key: str | None = None,
) -> None:
    """What a new job's door asks before it submits `spec`: BudgetExceeded at the hard
    limit, BudgetRefused for a spec a cost budget cannot price. A repeat of a request
    already answered (its Idempotency-Key names a job) passes: it starts nothing new."""
    if idempotency_key is not None and await has_job_keyed(session, team_id, idempotency_key):
        return
    found = await standing(session, team_id, prices, now)
    await session.rollback()
    if found is None:
        return
    if found.exhausted:
        raise BudgetExceeded(found.team, found.limit, found.spend, found.end)
    if found.limit.cost is not None and unpriced(spec, prices):
        models = models_of(spec.model_dump(mode="json"))
        raise BudgetRefused(
            "student.base_model",
            f"team {found.team!r} has a budget in cost, and the price table has no price "
            f"for {models.student} or {models.teacher} on {models.backend}: its cost could "
            "not be counted",
        )


def unpriced(spec: JobSpec, prices: PriceTable) -> bool:
    """Whether the price table lacks a price for some token the spec will use."""
    return (
        prices.cost(
            *models_of(spec.model_dump(mode="json")),
            sampled=1,
            teacher_tokens=1,
            trained=1,
            eval_tokens=1 if spec.eval else 0,
        )
        is None
    )


async def has_job_keyed(session: AsyncSession, team_id: int, key: str) -> bool:
    found = await session.execute(
        select(Job.id).where(Job.team_id == team_id, Job.idempotency_key == key)
    )
    return found.first() is not None


@dataclass(frozen=True)
class Verdict:
    """What a worker learns after recording a step: whether the team has a budget (then it
    waits for this check before each step) and whether its job is to pause."""

    budgeted: bool
    action: JobAction | None = None


async def check_spending(
    session: AsyncSession, team_id: int, prices: PriceTable, now: datetime
) -> Verdict:
    """After a step was recorded: warn the team once a period past its soft threshold (a
    `budget.threshold` delivery, with the mark that it was sent, in one transaction), and
    at its hard limit pause its jobs (`stop_spending`) and answer `pause`."""
    found = await standing(session, team_id, prices, now)
    if found is None:
        await session.rollback()
        return Verdict(budgeted=False)
    if past_soft(found.limit, found.spend) and await mark_warned(session, team_id, found.start):
        await add_deliveries(
            session, team_id, None, WebhookEvent.budget_threshold, found.figures(), now
        )
    await session.commit()
    if not found.exhausted:
        return Verdict(budgeted=True)
    await stop_spending(session, found, now)
    return Verdict(budgeted=True, action=JobAction.pause)


async def stop_spending(session: AsyncSession, found: Standing, now: datetime) -> list[int]:
    """The team is at its hard limit: each running job is asked to pause at its next step
    boundary and each queued job is paused, with an event saying why; they resume by
    themselves (`resume_spending`). Returns the jobs changed."""
    message = exceeded_message(found.team, found.limit, found.spend, found.end)
    plans = {
        JobStatus.running: Plan(
            JobStatus.pausing,
            f"Pausing at the next step boundary: {message}",
            {"requested_action": JobAction.pause, "stop_reason": BUDGET_STOP},
        ),
        JobStatus.queued: Plan(
            JobStatus.paused,
            f"Paused while queued: {message}",
            {"requested_action": None, "queue_reason": None, "stop_reason": BUDGET_STOP},
        ),
    }
    return await move_jobs(session, found, plans)


async def resume_spending(
    session: AsyncSession, queue: JobQueue, prices: PriceTable, now: datetime
) -> list[int]:
    """Resume the jobs a budget paused wherever the team may spend again (the budget was
    raised or removed, or the period turned), and send them to the workers: what the
    requeuer does every pass. Returns the jobs resumed."""
    teams = await session.execute(
        select(Job.team_id)
        .where(
            Job.stop_reason == BUDGET_STOP, Job.status.in_([JobStatus.paused, JobStatus.pausing])
        )
        .distinct()
    )
    resumed: list[int] = []
    for team_id in list(teams.scalars()):
        resumed += await resume_team(session, queue, team_id, prices, now)
    return resumed


async def resume_team(
    session: AsyncSession, queue: JobQueue, team_id: int, prices: PriceTable, now: datetime
) -> list[int]:
    """Resume the team's jobs its budget paused, if it may spend again."""
    found = await standing(session, team_id, prices, now)
    if found is not None and found.exhausted:
        await session.rollback()
        return []
    why = (
        "the team has no budget any more"
        if found is None
        else f"team {found.team!r} may spend again: "
        f"{amount_text(found.limit, left(found.limit, found.spend))} left this "
        f"{found.limit.period.value}"
    )
    plans = {
        JobStatus.paused: Plan(
            JobStatus.queued,
            f"Resumed: {why}; waiting for a worker",
            {"requested_action": None, "queue_reason": None, "stop_reason": None},
        ),
        JobStatus.pausing: Plan(
            JobStatus.running,
            f"Resumed before the pause took effect: {why}",
            {"requested_action": None, "stop_reason": None},
        ),
    }
    moved = await move_jobs(session, found, plans, team_id=team_id, budget_paused=True)
    for job_id in moved:
        await enqueue_job(session, queue, job_id)
    return moved


async def move_jobs(
    session: AsyncSession,
    found: Standing | None,
    plans: dict[JobStatus, Plan],
    *,
    team_id: int | None = None,
    budget_paused: bool = False,
) -> list[int]:
    """Apply `plans` (by the status a job is in) to the team's jobs, each with a
    compare-and-set of its own (a job that changed meanwhile is left to the next pass)."""
    query = (
        select(Job)
        .where(
            Job.team_id == (team_id if found is None else found.team_id),
            Job.status.in_(list(plans)),
        )
        .order_by(Job.id)
        .limit(MAX_JOBS_A_PASS)
        .execution_options(populate_existing=True)
    )
    if budget_paused:
        query = query.where(Job.stop_reason == BUDGET_STOP)
    jobs = [detach(session, job) for job in (await session.execute(query)).scalars()]
    data = None if found is None else {"budget": found.figures()}
    moved = []
    for job in jobs:
        if await compare_and_set(session, job, plans[JobStatus(job.status)], event_data=data):
            assert job.id is not None
            moved.append(job.id)
    await session.commit()
    return moved


async def budget_public(
    session: AsyncSession, team_id: int, prices: PriceTable, now: datetime
) -> BudgetPublic | None:
    """The team's budget with its spend this period, per day; None without one."""
    found = await standing(session, team_id, prices, now)
    if found is None:
        return None
    spend, limit = found.spend, found.limit
    state = "exhausted" if found.exhausted else "soft" if past_soft(limit, spend) else "ok"
    priced = bool(prices)
    return BudgetPublic(
        team=found.team,
        team_id=team_id,
        tokens=limit.tokens,
        cost=limit.cost,
        soft=limit.soft,
        period=limit.period,
        period_start=found.start,
        period_end=found.end,
        spent=spend_public(spend, priced),
        used=used(limit, spend),
        held=used(limit, found.held),
        left=left(limit, found.committed),
        fraction=used(limit, spend) / limit.amount,
        state=state,
        days=[
            SpendDay(day=day, **spend_public(s, priced).model_dump())
            for day, s in sorted(found.days.items())
        ],
    )


def spend_public(spend: Spend, priced: bool) -> SpendPublic:
    return SpendPublic(
        tokens=spend.tokens,
        cost=spend.cost if priced else None,
        unpriced_tokens=spend.unpriced_tokens,
    )


async def set_budget(
    session: AsyncSession,
    queue: JobQueue,
    team_id: int,
    update: BudgetUpdate,
    prices: PriceTable,
    now: datetime,
) -> BudgetPublic:
    """Set the team's budget and resume what its old one paused, if the new one allows;
    BudgetRefused for a budget in cost without a price table to count it."""
    if update.cost is not None and not prices:
        raise BudgetRefused(
            "cost",
            "a budget in cost needs the service's price table (OPD_PRICES); give it in "
            "tokens instead",
        )
    limit = Limit(update.tokens, update.cost, update.soft, update.period)
    await put_budget(session, team_id, limit, now)
    await resume_team(session, queue, team_id, prices, now)
    found = await budget_public(session, team_id, prices, now)
    assert found is not None
    return found


async def remove_budget(
    session: AsyncSession, queue: JobQueue, team_id: int, prices: PriceTable, now: datetime
) -> bool:
    """Remove the team's budget and resume what it paused; whether it had one."""
    removed = await delete_budget(session, team_id)
    await resume_team(session, queue, team_id, prices, now)
    return removed
