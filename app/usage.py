"""Usage reports: per-job-per-day rows added up by job or by day (and by team for an admin
asking about every team), each with its estimated cost when the price table covers it."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import date
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from app.models import TokenUsage
from app.pricing import PriceTable
from app.store.usage import COUNTERS, UsageRow


class GroupBy(StrEnum):
    job = "job"
    day = "day"


class UsageLine(TokenUsage):
    team: str
    job_id: int | None = Field(None, description="With group_by=job.")
    job_name: str | None = Field(None, description="With group_by=job.")
    day: date | None = Field(None, description="With group_by=day (UTC).")
    estimated_cost: float | None = Field(
        None, description="From the price table; null without one or without a needed price."
    )


class UsageTotal(TokenUsage):
    estimated_cost: float | None = None


class UsageReport(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    from_: date = Field(alias="from", description="First day counted (UTC).")
    to: date = Field(description="Last day counted (UTC).")
    group_by: GroupBy
    team: str | None = Field(description="The team asked about; null: every team.")
    priced: bool = Field(description="Whether the service has a price table.")
    rows: list[UsageLine]
    total: UsageTotal


def add_cost(total: float | None, cost: float | None, first: bool) -> float | None:
    """Costs add up only while every part has one: one unknown part makes the sum unknown."""
    if first:
        return cost
    return None if total is None or cost is None else total + cost


def summarize(rows: Sequence[UsageRow], group_by: GroupBy, prices: PriceTable) -> list[UsageLine]:
    """The rows added up per (team, job) or (team, day), in the order first seen."""
    lines: dict[tuple[str, object], UsageLine] = {}
    for row in rows:
        cost = prices.cost(
            row.backend,
            row.student,
            row.teacher,
            sampled=row.counts["sampled_tokens"],
            teacher_tokens=row.counts["teacher_tokens"],
            trained=row.counts["trained_tokens"],
            eval_tokens=row.counts["eval_tokens"],
        )
        key = (row.team, row.job_id if group_by is GroupBy.job else row.day)
        line = lines.get(key)
        if line is None:
            line = lines[key] = UsageLine(
                team=row.team,
                job_id=row.job_id if group_by is GroupBy.job else None,
                job_name=row.job_name if group_by is GroupBy.job else None,
                day=row.day if group_by is GroupBy.day else None,
            )
            line.estimated_cost = cost
        else:
            line.estimated_cost = add_cost(line.estimated_cost, cost, first=False)
        for column in COUNTERS:
            setattr(line, column, getattr(line, column) + row.counts[column])
    return sorted(lines.values(), key=lambda line: line.team)


def total_of(lines: Sequence[UsageLine]) -> UsageTotal:
    total = UsageTotal()
    for index, line in enumerate(lines):
        for column in COUNTERS:
            setattr(total, column, getattr(total, column) + getattr(line, column))
        total.estimated_cost = add_cost(total.estimated_cost, line.estimated_cost, index == 0)
    return total
