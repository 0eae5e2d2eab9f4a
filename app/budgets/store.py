"""Budgets and what a team spent, as the database holds them: the budget row, the sum of
the team's spend rows (app/usage/tables.py) over a period, priced, and what its requests
under way hold."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from datetime import date, datetime

from sqlalchemy import delete, func, or_, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from app.auth.tables import Team
from app.budgets.rules import Limit, Period, Spend, plus
from app.budgets.tables import BudgetHold, TeamBudget
from app.core.db import insert_for
from app.core.pricing import PriceTable
from app.usage.store import COUNTERS, PricedModels
from app.usage.tables import TeamSpendDay


def limit_of(budget: TeamBudget) -> Limit:
    return Limit(budget.tokens, budget.cost, budget.soft, Period(budget.period))


async def budget_of(session: AsyncSession, team_id: int) -> TeamBudget | None:
    return await session.get(TeamBudget, team_id, populate_existing=True)


async def team_named(session: AsyncSession, name_or_id: str) -> Team | None:
    """A team by its name, else by its id when `name_or_id` is a number in ASCII digits
    (`isdigit` also takes '²' and '١', which `int` refuses or reads as another number)."""
    team = (await session.execute(select(Team).where(Team.name == name_or_id))).scalar()
    if team is None and name_or_id.isascii() and name_or_id.isdigit() and int(name_or_id) < 2**31:
        team = await session.get(Team, int(name_or_id))
    return team


async def put_budget(session: AsyncSession, team_id: int, limit: Limit, now: datetime) -> None:
    """Set (or replace) the team's budget in one upsert, so that concurrent PUTs on a team
    without one do not both insert; the soft warning may be sent again this period. Commits."""
    values = {
        "tokens": limit.tokens,
        "cost": limit.cost,
        "soft": limit.soft,
        "period": limit.period.value,
        "warned_for": None,
        "updated_at": now,
    }
    dialect = (await session.connection()).dialect.name
    statement = insert_for(dialect)(TeamBudget).values(team_id=team_id, **values)
    await session.execute(statement.on_conflict_do_update(index_elements=["team_id"], set_=values))
    await session.commit()


async def delete_budget(session: AsyncSession, team_id: int) -> bool:
    """Remove the team's budget; whether it had one. Commits."""
    result = await session.execute(delete(TeamBudget).where(TeamBudget.team_id == team_id))
    await session.commit()
    return bool(result.rowcount)


async def mark_warned(session: AsyncSession, team_id: int, period_start: date) -> bool:
    """Note that the period's soft warning is being sent; False when another process did
    first (the caller commits, with the warning's deliveries)."""
    result = await session.execute(
        update(TeamBudget)
        .where(
            TeamBudget.team_id == team_id,
            or_(TeamBudget.warned_for.is_(None), TeamBudget.warned_for != period_start),
        )
        .values(warned_for=period_start)
    )
    return result.rowcount == 1


async def spend_by_day(
    session: AsyncSession, team_id: int, first: date, end: date, prices: PriceTable
) -> dict[date, Spend]:
    """The team's spend on each day from `first` up to `end` (excluded) that has any: a few
    rows a day (one per priced models), priced."""
    rows = await session.execute(
        select(
            TeamSpendDay.day,
            TeamSpendDay.backend,
            TeamSpendDay.student,
            TeamSpendDay.teacher,
            *(getattr(TeamSpendDay, column) for column in COUNTERS),
        )
        .where(TeamSpendDay.team_id == team_id, TeamSpendDay.day >= first, TeamSpendDay.day < end)
        .order_by(TeamSpendDay.day)
    )
    days: dict[date, Spend] = defaultdict(Spend)
    for day, backend, student, teacher, *counts in rows:
        models = PricedModels(backend, student, teacher)
        spent = priced(prices, models, dict(zip(COUNTERS, counts, strict=True)))
        days[day] = plus(days[day], spent)
    return dict(days)


def priced(prices: PriceTable, models: PricedModels, counts: Mapping[str, int]) -> Spend:
    """Usage counters (COUNTERS' names) of one job's models as a budget counts them: their
    tokens, their cost, and the tokens no price covers (they cost nothing)."""
    tokens = sum(counts.values())
    named = {name: counts.get(column, 0) for name, column in zip(PRICED, COUNTERS, strict=True)}
    cost = prices.cost(*models, **named)
    return Spend(tokens, cost or 0.0, tokens if cost is None else 0)


PRICED = ("sampled", "teacher_tokens", "trained", "eval_tokens")
"""`PriceTable.cost`'s names for the usage counters, in COUNTERS' order."""


def total(days: dict[date, Spend]) -> Spend:
    return Spend(
        sum(s.tokens for s in days.values()),
        sum(s.cost for s in days.values()),
        sum(s.unpriced_tokens for s in days.values()),
    )


async def add_hold(
    session: AsyncSession, team_id: int, held: Spend, expires_at: datetime, now: datetime
) -> int:
    """Hold `held` of the team's budget until `expires_at` (a write first: SQLite's one
    writer is held from here), letting go of the team's expired holds."""
    hold = BudgetHold(team_id=team_id, tokens=held.tokens, cost=held.cost, expires_at=expires_at)
    session.add(hold)
    await session.flush()
    await session.execute(
        delete(BudgetHold).where(BudgetHold.team_id == team_id, BudgetHold.expires_at <= now)
    )
    assert hold.id is not None
    return hold.id


async def holds_of(session: AsyncSession, team_id: int, now: datetime) -> Spend:
    """What the team's requests under way hold (those not expired)."""
    tokens, cost = (
        await session.execute(
            select(
                func.coalesce(func.sum(BudgetHold.tokens), 0),
                func.coalesce(func.sum(BudgetHold.cost), 0.0),
            ).where(BudgetHold.team_id == team_id, BudgetHold.expires_at > now)
        )
    ).one()
    return Spend(int(tokens), float(cost))


async def drop_hold(session: AsyncSession, hold_id: int) -> None:
    """Let go of a hold, in the caller's transaction (where its usage is recorded)."""
    await session.execute(delete(BudgetHold).where(BudgetHold.id == hold_id))
