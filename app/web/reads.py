"""The reads the pages make that no API endpoint serves as such: a searchable, counted job
list and each job's latest figures. Every read is scoped like the API (`scope` None = an
admin, every team). Curves are not read here: the pages' charts fetch them from the API.

The metric reads touch a few rows through the (job_id, step) key; they are the ones to
move to the metric store of issue 9 when it lands.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func
from sqlalchemy.ext.asyncio import AsyncSession
from sqlmodel import select

from app.models import Checkpoint, Event, Job, JobStatus, StepMetric

EVAL_ACCURACY = "eval/accuracy"
REVERSE_KL = "opd/reverse_kl_mean"


@dataclass(frozen=True)
class JobFigures:
    """What the table shows of a job's metrics: the latest reverse KL and eval accuracy."""

    reverse_kl: float | None = None
    eval_accuracy: float | None = None


def scoped(query: Any, scope: int | None) -> Any:
    return query if scope is None else query.where(Job.team_id == scope)


async def list_jobs(
    session: AsyncSession,
    scope: int | None,
    status: JobStatus | None,
    search: str,
    offset: int,
    limit: int,
) -> tuple[list[Job], int]:
    """One page of jobs, newest first, and how many match in all. `search` matches any
    part of the name, ignoring case."""
    where = []
    if status is not None:
        where.append(Job.status == status)
    if search:
        where.append(func.lower(Job.name).contains(search.lower(), autoescape=True))
    total = (
        await session.execute(scoped(select(func.count(Job.id)), scope).where(*where))
    ).scalar_one()
    query = scoped(select(Job), scope).where(*where).order_by(Job.id.desc())
    jobs = list((await session.execute(query.offset(offset).limit(limit))).scalars())
    return jobs, total


async def jobs_by_id(session: AsyncSession, scope: int | None, ids: list[int]) -> list[Job]:
    """The visible jobs among `ids`, newest first (others' jobs are left out silently)."""
    query = scoped(select(Job), scope).where(Job.id.in_(ids)).order_by(Job.id.desc())
    return list((await session.execute(query)).scalars())


async def latest_figures(session: AsyncSession, jobs: list[Job]) -> dict[int, JobFigures]:
    """Each job's latest reverse KL (its last step's row) and, for a job whose spec asks
    for evals, the accuracy of its latest eval."""
    if not jobs:
        return {}
    last = (
        select(StepMetric.job_id, func.max(StepMetric.step).label("step"))
        .where(StepMetric.job_id.in_([job.id for job in jobs]))
        .group_by(StepMetric.job_id)
        .subquery()
    )
    rows = await session.execute(
        select(StepMetric.job_id, StepMetric.metrics[REVERSE_KL].as_float()).join(
            last, (StepMetric.job_id == last.c.job_id) & (StepMetric.step == last.c.step)
        )
    )
    kl = {job_id: value for job_id, value in rows}
    figures = {}
    for job in jobs:
        accuracy = (
            await latest_value(session, job.id, EVAL_ACCURACY) if job.spec.get("eval") else None
        )
        figures[job.id] = JobFigures(kl.get(job.id), accuracy)
    return figures


async def latest_value(session: AsyncSession, job_id: int, key: str) -> float | None:
    """The metric's value at the latest step that has it (read backwards from the last
    step, so an eval every N steps costs at most N rows)."""
    value = StepMetric.metrics[key].as_float()
    query = (
        select(value)
        .where(StepMetric.job_id == job_id, value.is_not(None))
        .order_by(StepMetric.step.desc())
        .limit(1)
    )
    return (await session.execute(query)).scalar_one_or_none()


async def recent_steps(
    session: AsyncSession, job_id: int, count: int
) -> list[tuple[int, datetime, dict[str, Any]]]:
    """The job's last `count` step rows (step, recorded_at, metrics), oldest first."""
    query = (
        select(StepMetric.step, StepMetric.recorded_at, StepMetric.metrics)
        .where(StepMetric.job_id == job_id)
        .order_by(StepMetric.step.desc())
        .limit(count)
    )
    rows = (await session.execute(query)).all()
    return [(step, at, metrics) for step, at, metrics in reversed(rows)]


async def first_metric_names(session: AsyncSession, job_id: int) -> list[str]:
    """The metric names of the job's first step (evals before training record there)."""
    query = (
        select(StepMetric.metrics)
        .where(StepMetric.job_id == job_id)
        .order_by(StepMetric.step)
        .limit(1)
    )
    metrics = (await session.execute(query)).scalar_one_or_none()
    return list(metrics or {})


async def job_events(session: AsyncSession, job_id: int, limit: int) -> list[Event]:
    """The job's latest `limit` events, oldest first."""
    query = select(Event).where(Event.job_id == job_id).order_by(Event.id.desc()).limit(limit)
    return list(reversed(list((await session.execute(query)).scalars())))


async def job_checkpoints(session: AsyncSession, job_id: int, limit: int) -> list[Checkpoint]:
    """The job's latest `limit` checkpoints, newest first."""
    query = (
        select(Checkpoint)
        .where(Checkpoint.job_id == job_id)
        .order_by(Checkpoint.id.desc())
        .limit(limit)
    )
    return list((await session.execute(query)).scalars())
