"""Model aliases: a spec's `alias` names, on the OpenAI-compatible doors, the newest
succeeded job of the team whose spec carries it, so that retrained weights serve under the
name clients already send. Read from the jobs' specs: the alias moves when a job
succeeds, with nothing else to update."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from app.core.db import detach
from app.jobs.schemas import JobStatus
from app.jobs.tables import Job


def alias_of() -> Any:
    """The spec's `alias` as a column (JSON read on SQLite and Postgres alike)."""
    spec: Any = Job.spec
    return spec["alias"].as_string()


async def aliased(session: AsyncSession, team_id: int, alias: str) -> Job | None:
    """The team's newest succeeded job (by id) whose spec names `alias`."""
    column: Any = Job.id
    query = (
        select(Job)
        .where(Job.team_id == team_id, Job.status == JobStatus.succeeded, alias_of() == alias)
        .order_by(column.desc())
        .limit(1)
        .execution_options(populate_existing=True)
    )
    job = (await session.execute(query)).scalar_one_or_none()
    return None if job is None else detach(session, job)


async def aliases(session: AsyncSession, team_id: int) -> dict[str, datetime | None]:
    """Each alias of the team's succeeded jobs, and when the newest job it names ended."""
    column: Any = Job.id
    query = (
        select(alias_of(), Job.finished_at)
        .where(Job.team_id == team_id, Job.status == JobStatus.succeeded, alias_of().isnot(None))
        .order_by(column.asc())
    )
    return {alias: ended for alias, ended in (await session.execute(query)).all()}
