"""Budgets and what a team spent, as the database holds them: the budget row, and the sum
of the team's spend rows (app/usage/tables.py) over a period, priced."""

from __future__ import annotations

from collections import defaultdict
from datetime import date, datetime

from sqlalchemy import delete, or_, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from app.auth.tables import Team
from app.budgets.rules import Limit, Period, Spend
from app.budgets.tables import TeamBudget
from app.core.db import insert_for
from app.core.pricing import PriceTable
from app.usage.store import COUNTERS
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
        tokens = sum(counts)
        cost = prices.cost(backend, student, teacher, **dict(zip(PRICED, counts, strict=True)))
        before = days[day]
        days[day] = Spend(
            before.tokens + tokens,
            before.cost + (cost or 0.0),
            before.unpriced_tokens + (tokens if cost is None else 0),
        )
    return dict(days)


PRICED = ("sampled", "teacher_tokens", "trained", "eval_tokens")
"""`PriceTable.cost`'s names for the usage counters, in COUNTERS' order."""


def total(days: dict[date, Spend]) -> Spend:
    return Spend(
        sum(s.tokens for s in days.values()),
        sum(s.cost for s in days.values()),
        sum(s.unpriced_tokens for s in days.values()),
    )
