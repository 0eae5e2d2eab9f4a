"""The reads the pages make that no API endpoint serves as such: a searchable, counted job
list, a job's last steps (for its pace), latest events, checkpoints and kept rollouts.
Every job read is scoped like the API (`scope` None = an admin, every team). Curves are not
read here: the pages' charts fetch them from the API; the table's figures come from the
job's summary (kept on its row).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import func
from sqlalchemy.ext.asyncio import AsyncSession
from sqlmodel import select

from app.curves.tables import StepMetric
from app.jobs.filters import JobFilter
from app.jobs.schemas import JobStatus
from app.jobs.tables import Checkpoint, Event, Job
from app.samples.tables import Sample


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
    part of the name, ignoring case (the API's `name=` filter)."""
    where = JobFilter(status=status, name=search).where()
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


async def job_notes(session: AsyncSession, job_id: int) -> list[Event]:
    """The job's notes, oldest first: warnings whose data names a `note` (a teacher that
    answers far below what it measured, ...), which the job page shows at its top."""
    query = (
        select(Event)
        .where(Event.job_id == job_id, Event.level == "warning")
        .order_by(Event.id.desc())
        .limit(NOTES_READ)
    )
    warnings = reversed(list((await session.execute(query)).scalars()))
    return [event for event in warnings if isinstance(event.data, dict) and "note" in event.data]


NOTES_READ = 50


async def job_checkpoints(session: AsyncSession, job_id: int, limit: int) -> list[Checkpoint]:
    """The job's latest `limit` checkpoints, newest first."""
    query = (
        select(Checkpoint)
        .where(Checkpoint.job_id == job_id)
        .order_by(Checkpoint.id.desc())
        .limit(limit)
    )
    return list((await session.execute(query)).scalars())


async def kept_rollouts(session: AsyncSession, job_id: int, limit: int) -> list[Sample]:
    """The job's latest `limit` kept rollouts, oldest first."""
    query = select(Sample).where(Sample.job_id == job_id).order_by(Sample.id.desc()).limit(limit)
    return list(reversed(list((await session.execute(query)).scalars())))
