"""A budget's rules as pure decisions: its period, what it counts, and where the team
stands against it. Nothing here touches the database: the store reads the spend and the
service acts on what these decide."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from enum import StrEnum

DEFAULT_SOFT = 0.8
BUDGET_STOP = "budget"
"""A job's `stop_reason` while its team's budget holds it paused: it resumes by itself."""


class Period(StrEnum):
    """The span a budget counts over, in UTC; the next one starts from nothing."""

    month = "month"
    week = "week"
    day = "day"


def period_of(period: Period, now: datetime) -> tuple[date, date]:
    """The first day of the period `now` falls in, and the first day of the next."""
    today = now.astimezone(UTC).date()
    if period is Period.day:
        return today, today + timedelta(days=1)
    if period is Period.week:
        start = today - timedelta(days=today.weekday())
        return start, start + timedelta(days=7)
    start = today.replace(day=1)
    following = (start + timedelta(days=32)).replace(day=1)
    return start, following


def period_end(period: Period, now: datetime) -> datetime:
    """When the period `now` falls in ends (the next one starts), as a UTC time."""
    return datetime.combine(period_of(period, now)[1], time(), UTC)


@dataclass(frozen=True)
class Limit:
    """A team's budget: a token count or a cost (exactly one), and its soft share."""

    tokens: int | None
    cost: float | None
    soft: float = DEFAULT_SOFT
    period: Period = Period.month

    @property
    def unit(self) -> str:
        return "tokens" if self.tokens is not None else "cost"

    @property
    def amount(self) -> float:
        return float(self.tokens if self.tokens is not None else self.cost or 0)


@dataclass(frozen=True)
class Spend:
    """What a team used in a period: every token its jobs and completions used, their cost
    from the price table, and the tokens no price covered (they cost nothing here)."""

    tokens: int = 0
    cost: float = 0.0
    unpriced_tokens: int = 0


def plus(spend: Spend, more: Spend) -> Spend:
    """Two spends added up (what was spent and what requests under way hold)."""
    return Spend(
        spend.tokens + more.tokens,
        spend.cost + more.cost,
        spend.unpriced_tokens + more.unpriced_tokens,
    )


def used(limit: Limit, spend: Spend) -> float:
    """What the budget counts of `spend`: its tokens or its cost."""
    return float(spend.tokens) if limit.tokens is not None else spend.cost


def exhausted(limit: Limit, spend: Spend) -> bool:
    """The hard limit is reached: nothing more may start, and running jobs pause."""
    return used(limit, spend) >= limit.amount


def past_soft(limit: Limit, spend: Spend) -> bool:
    """The soft threshold is reached: the team is warned, once a period."""
    return used(limit, spend) >= limit.soft * limit.amount


def left(limit: Limit, spend: Spend) -> float:
    """What the team may still spend this period (0 once the limit is reached)."""
    return max(limit.amount - used(limit, spend), 0.0)


def asked_message(team: str, limit: Limit, spend: Spend, held: Spend, asked: Spend) -> str:
    """Why a request that may spend `asked` does not fit what is left."""
    holding = f" ({amount_text(limit, used(limit, held))} held by requests under way)"
    return (
        f"this request may use up to {amount_text(limit, used(limit, asked))} (its prompts "
        f"x n x models x (prompt + max_tokens)); team {team!r} has "
        f"{amount_text(limit, left(limit, plus(spend, held)))} left of its "
        f"{amount_text(limit, limit.amount)} budget this {limit.period.value}"
        f"{holding if used(limit, held) else ''}: ask for fewer tokens, or wait for the "
        "requests under way, or for an admin to raise it"
    )


def amount_text(limit: Limit, value: float) -> str:
    """A figure in the budget's unit, as people read it."""
    if limit.tokens is not None:
        return f"{round(value):,} tokens"
    return f"{value:,.2f}"


def exceeded_message(team: str, limit: Limit, spend: Spend, ends: datetime) -> str:
    """Why a team may not spend more, with what it spent, its budget and when that ends."""
    return (
        f"team {team!r} spent {amount_text(limit, used(limit, spend))} of its "
        f"{amount_text(limit, limit.amount)} budget this {limit.period.value}; it resets "
        f"at {ends.isoformat()} or when an admin raises it"
    )
