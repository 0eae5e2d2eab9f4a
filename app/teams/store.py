"""Teams as admins see them: their limits (own or the service's default) and load."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from app.auth.tables import Team
from app.core.db import commit_or_flush
from app.jobs.limits import Limits
from app.jobs.schemas import ACTIVE_STATUSES, JobStatus
from app.jobs.tables import Job


class TeamNotFound(LookupError):
    """No team with this name."""


@dataclass(frozen=True)
class TeamView:
    id: int
    name: str
    max_running: int | None
    max_queued: int | None
    effective_max_running: int | None
    effective_max_queued: int | None
    running: int
    queued: int


def count_in(statuses: Any) -> Any:
    return func.count(Job.id).filter(Job.status.in_(statuses))


async def list_teams(
    session: AsyncSession, limits: Limits, name: str | None = None
) -> list[TeamView]:
    """Every team (or the one named), by name, with its jobs running and queued."""
    query = (
        select(
            Team.id,
            Team.name,
            Team.max_running,
            Team.max_queued,
            count_in(ACTIVE_STATUSES),
            count_in([JobStatus.queued]),
        )
        .outerjoin(Job, Job.team_id == Team.id)
        .group_by(Team.id, Team.name, Team.max_running, Team.max_queued)
        .order_by(Team.name)
    )
    if name is not None:
        query = query.where(Team.name == name)
    return [
        TeamView(
            team_id,
            team,
            max_running,
            max_queued,
            max_running or limits.max_running,
            max_queued or limits.max_queued,
            running,
            queued,
        )
        for team_id, team, max_running, max_queued, running, queued in await session.execute(query)
    ]


async def set_limits(
    session: AsyncSession,
    name: str,
    changes: dict[str, int | None],
    limits: Limits,
    *,
    commit: bool = True,
) -> TeamView:
    """Set the named limits (`max_running`, `max_queued`; None = the service's default;
    commit=False: the caller commits); no change reads the team as it is."""
    if changes:
        await session.execute(update(Team).where(Team.name == name).values(**changes))
        await commit_or_flush(session, commit)
    teams = await list_teams(session, limits, name)
    if not teams:
        raise TeamNotFound(f"no team named {name!r}")
    return teams[0]
