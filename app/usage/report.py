"""Usage reports: per-job-per-day rows added up by job or by day (and by team for an admin
asking about every team), each with its estimated cost when the price table covers it."""

from __future__ import annotations

from collections.abc import Sequence

from app.core.pricing import PriceTable
from app.usage.schemas import GroupBy, UsageLine, UsageTotal
from app.usage.store import COUNTERS, UsageRow


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
