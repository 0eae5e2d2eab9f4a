"""Reading a job row, and the predicate and row builder every writer shares."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, select
from sqlalchemy.ext.asyncio import AsyncSession

from app.core.db import detach
from app.core.tables import utcnow
from app.jobs.errors import JobNotFound
from app.jobs.schemas import ACTIVE_STATUSES, EventLevel
from app.jobs.tables import Event, Job


async def get_job(session: AsyncSession, job_id: int, team_id: int | None = None) -> Job:
    """The job, read fresh from the database; `team_id` None means any team (admin)."""
    query = select(Job).where(Job.id == job_id).execution_options(populate_existing=True)
    if team_id is not None:
        query = query.where(Job.team_id == team_id)
    job = (await session.execute(query)).scalar_one_or_none()
    if job is None:
        raise JobNotFound(f"job {job_id} not found")
    return detach(session, job)


def held(job_id: int, worker_id: str) -> tuple[ColumnElement[bool], ...]:
    """The job row, if `worker_id` still holds it (it runs there and has not ended)."""
    return (Job.id == job_id, Job.worker_id == worker_id, Job.status.in_(ACTIVE_STATUSES))


def event_row(
    job_id: int,
    message: str,
    level: EventLevel = EventLevel.info,
    data: dict[str, Any] | None = None,
    now: datetime | None = None,
) -> Event:
    return Event(job_id=job_id, level=level, message=message, data=data, created_at=now or utcnow())


async def get_jobs(session: AsyncSession, job_ids: Sequence[int], team_id: int | None) -> list[Job]:
    """The jobs, in the order asked for; JobNotFound names the first one missing (or
    another team's: `team_id` None means any team)."""
    query = select(Job).where(Job.id.in_(job_ids)).execution_options(populate_existing=True)
    if team_id is not None:
        query = query.where(Job.team_id == team_id)
    found = {job.id: detach(session, job) for job in (await session.execute(query)).scalars()}
    for job_id in job_ids:
        if job_id not in found:
            raise JobNotFound(f"job {job_id} not found")
    return [found[job_id] for job_id in job_ids]
