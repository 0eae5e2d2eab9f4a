"""Token usage kept as steps are recorded: totals on the job row (its body shows them) and
per UTC day in `usage_days` (what `GET /v1/usage` adds up), and per team, day and priced
models in `team_spend_days` (what a budget adds up).

A step's usage comes from its `usage/*` metrics. A replayed step overwrites its metric
row, so its usage counts once: the change from the row it replaces is what is added.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any, NamedTuple

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession

from app.auth.tables import Team
from app.core.db import insert_for
from app.jobs.tables import Job
from app.usage.tables import TeamSpendDay, UsageDay
from kernel.spec.teachers import priced_teacher

USAGE_METRICS = {
    "usage/sampled_tokens": "sampled_tokens",
    "usage/teacher_tokens": "teacher_tokens",
    "usage/trained_tokens": "trained_tokens",
    "usage/eval_tokens": "eval_tokens",
}
COUNTERS = tuple(USAGE_METRICS.values())


def tokens(metrics: Mapping[str, float | None] | None, name: str) -> int:
    value = (metrics or {}).get(name)
    return 0 if value is None else round(value)


def usage_change(
    metrics: Mapping[str, float | None], before: Mapping[str, float | None] | None
) -> dict[str, int]:
    """What a step adds to the counters: its usage less that of the row it overwrites."""
    change = {
        column: tokens(metrics, name) - tokens(before, name)
        for name, column in USAGE_METRICS.items()
    }
    return {column: delta for column, delta in change.items() if delta}


def counter_increments(change: Mapping[str, int]) -> dict[str, Any]:
    """The job row's usage totals plus `change`, as values for the UPDATE that records a step."""
    return {column: getattr(Job, column) + delta for column, delta in change.items()}


class PricedModels(NamedTuple):
    """What a job's tokens are priced at: its backend, student and teacher models."""

    backend: str
    student: str
    teacher: str


def models_of(spec: Mapping[str, Any]) -> PricedModels:
    """The priced models of a stored (or dumped) spec."""
    return PricedModels(
        spec["backend"],
        spec["student"]["base_model"],
        priced_teacher(spec["teacher"]["base_model"], spec.get("teachers")),
    )


def job_models() -> tuple[Any, ...]:
    """The columns `models_of` reads, as SQL over the jobs table (a RETURNING can carry
    them): backend, student, teacher, teachers."""
    return (
        Job.spec["backend"].as_string(),
        Job.spec["student"]["base_model"].as_string(),
        Job.spec["teacher"]["base_model"].as_string(),
        Job.spec["teachers"],
    )


def models_from(backend: str, student: str, teacher: str, teachers: Any) -> PricedModels:
    """`models_of` from the columns `job_models` reads."""
    return PricedModels(backend, student, priced_teacher(teacher, teachers))


async def add_usage_day(
    session: AsyncSession,
    dialect: str,
    job_id: int,
    team_id: int,
    change: Mapping[str, int],
    now: datetime,
    models: PricedModels,
) -> None:
    """Add a recorded step's usage to the job's row for today and to its team's for the
    job's models, in the caller's transaction."""
    insert = insert_for(dialect)
    rows = (
        (UsageDay, {"job_id": job_id}, ["job_id", "day"]),
        (TeamSpendDay, models._asdict(), ["team_id", "day", *PricedModels._fields]),
    )
    for table, keys, index in rows:
        statement = insert(table).values(day=now.date(), team_id=team_id, **keys, **change)
        await session.execute(
            statement.on_conflict_do_update(
                index_elements=index,
                set_={column: getattr(table, column) + delta for column, delta in change.items()},
            )
        )


@dataclass(frozen=True)
class UsageRow:
    """One job's usage on one day, with what pricing it needs."""

    team: str
    job_id: int
    job_name: str
    day: date
    backend: str
    student: str
    teacher: str
    counts: dict[str, int]


async def usage_rows(
    session: AsyncSession, team_id: int | None, first: date, last: date
) -> list[UsageRow]:
    """Each job's usage per day from `first` to `last` (inclusive), for one team (None:
    every team), in day and job order."""
    query = (
        select(
            Team.name,
            Job.id,
            Job.name,
            UsageDay.day,
            *job_models(),
            *(getattr(UsageDay, column) for column in COUNTERS),
        )
        .join(Job, Job.id == UsageDay.job_id)
        .join(Team, Team.id == UsageDay.team_id)
        .where(UsageDay.day >= first, UsageDay.day <= last)
        .order_by(UsageDay.day, Job.id)
    )
    if team_id is not None:
        query = query.where(UsageDay.team_id == team_id)
    rows: list[Any] = list(await session.execute(query))
    return [
        UsageRow(
            *row[:6],
            teacher=priced_teacher(row[6], row[7]),
            counts=dict(zip(COUNTERS, row[8:], strict=True)),
        )
        for row in rows
    ]


async def add_usage(
    session: AsyncSession, job: Job, change: Mapping[str, int], now: datetime
) -> None:
    """Add usage that no step recorded (a completion the service served from the job's
    weights) to the job's totals and today's rows; commits (what the caller wrote too)."""
    if change:
        dialect = (await session.connection()).dialect.name
        assert job.id is not None
        await session.execute(
            update(Job).where(Job.id == job.id).values(counter_increments(change))
        )
        models = models_of(job.spec)
        await add_usage_day(session, dialect, job.id, job.team_id, change, now, models)
    await session.commit()
