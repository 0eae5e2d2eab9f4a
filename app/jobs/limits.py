"""Per-team limits: how many jobs a team may run at once and keep queued, each a service-wide
default (settings) unless the team has its own.

Writes that a limit bounds (a job queued, a job started) first lock the team's row, so
they take turns per team on Postgres (SQLite has one writer at a time anyway) and the
count they check is the one they commit against.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, func, or_, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from app.auth.tables import Team
from app.core.config import DEFAULT_MAX_SPEC_BYTES, Settings
from app.jobs.schemas import ACTIVE_STATUSES, JobStatus
from app.jobs.tables import Job

UNLIMITED = 2**31 - 1
LIMIT_REASON = "Over its team's running limit"
"""How every queue_reason that a running limit wrote begins."""


@dataclass(frozen=True)
class Limits:
    """The service-wide defaults; None = no limit. And the largest spec a job may store."""

    max_running: int | None = None
    max_queued: int | None = None
    max_spec_bytes: int = DEFAULT_MAX_SPEC_BYTES

    @classmethod
    def of(cls, settings: Settings) -> Limits:
        return cls(settings.team_max_running, settings.team_max_queued, settings.max_spec_bytes)


class QueueFull(Exception):
    """The team already has as many queued jobs as it may."""

    def __init__(self, queued: int, limit: int) -> None:
        super().__init__(
            f"the team already has {queued} queued jobs, its limit (max_queued {limit}); "
            "submit again once some have started"
        )


def running_limit(defaults: Limits) -> ColumnElement[Any]:
    """The team's running limit as SQL, for queries that join `teams`."""
    return func.coalesce(Team.max_running, defaults.max_running or UNLIMITED)


def count_of(team_id: int, statuses: Any) -> Any:
    return (
        select(func.count())
        .where(Job.team_id == team_id, Job.status.in_(statuses))
        .scalar_subquery()
    )


def under_running_limit(team_id: int, defaults: Limits) -> ColumnElement[bool]:
    """True while the team runs fewer jobs than it may: a claim's extra condition."""
    limit = select(running_limit(defaults)).where(Team.id == team_id).scalar_subquery()
    return count_of(team_id, ACTIVE_STATUSES) < limit


def running_counts() -> Any:
    """Jobs each team runs (running, or stopping at a step boundary), as a subquery."""
    return (
        select(Job.team_id, func.count().label("running"))
        .where(Job.status.in_(ACTIVE_STATUSES))
        .group_by(Job.team_id)
        .subquery()
    )


def limited_teams(defaults: Limits) -> Any:
    """The teams running as many jobs as they may, as a subquery of their ids."""
    running = running_counts()
    return (
        select(Team.id)
        .join(running, running.c.team_id == Team.id)
        .where(running.c.running >= running_limit(defaults))
    )


async def lock_team(session: AsyncSession, team_id: int) -> None:
    """Hold the team's row until the transaction ends (FOR NO KEY UPDATE: job inserts that
    only check the foreign key are not held up). SQLite needs no lock: one writer."""
    await session.execute(select(Team.id).where(Team.id == team_id).with_for_update(key_share=True))


async def check_queued(session: AsyncSession, team_id: int, defaults: Limits) -> None:
    """After queueing a job (under the team lock): QueueFull if the team is now over."""
    team = await session.get(Team, team_id, populate_existing=True)
    assert team is not None
    limit = team.max_queued or defaults.max_queued
    if limit is None:
        return
    queued = (await session.execute(select(count_of(team_id, [JobStatus.queued])))).scalar_one()
    if queued > limit:
        raise QueueFull(queued - 1, limit)


async def running_limit_reason(session: AsyncSession, team_id: int, limits: Limits) -> str | None:
    """Why a new job of this team will wait, when its running limit is what holds it."""
    name, limit, running = (
        await session.execute(
            select(Team.name, running_limit(limits), count_of(team_id, ACTIVE_STATUSES)).where(
                Team.id == team_id
            )
        )
    ).one()
    return limit_reason(name, running, limit) if running >= limit else None


def limit_reason(team: str, running: int, limit: int) -> str:
    return (
        f"{LIMIT_REASON}: team {team!r} runs {running} of at most {limit} jobs at once; "
        "it starts when one of them ends"
    )


async def note_limits(session: AsyncSession, defaults: Limits) -> None:
    """Say on every queued job whether its team's running limit holds it back: the reason
    is written where it holds and cleared where it no longer does. Commits."""
    running = running_counts()
    rows = await session.execute(
        select(Team.id, Team.name, func.coalesce(running.c.running, 0), running_limit(defaults))
        .outerjoin(running, running.c.team_id == Team.id)
        .where(Team.id.in_(select(Job.team_id).where(Job.status == JobStatus.queued)))
    )
    for team_id, name, active, limit in rows:
        reason = limit_reason(name, active, limit) if active >= limit else None
        await session.execute(
            update(Job)
            .where(
                Job.team_id == team_id,
                Job.status == JobStatus.queued,
                or_(Job.queue_reason.is_(None), Job.queue_reason.startswith(LIMIT_REASON))
                if reason
                else Job.queue_reason.startswith(LIMIT_REASON),
                Job.queue_reason.is_distinct_from(reason),
            )
            .values(queue_reason=reason)
        )
    await session.commit()
