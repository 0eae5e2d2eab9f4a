"""Which queued job runs next, decided by the database so that every worker on every
machine agrees (and nothing depends on the order of Redis messages).

Among the teams under their running limit, the team running the fewest jobs goes first;
ties go to the team whose oldest queued job has waited longest. Within the team, the job
with the highest `priority`, then the longest waiting. A priority never moves a job past
another team's: it orders jobs within their own team only.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select

from app.auth.tables import Team
from app.jobs.limits import Limits, running_counts, running_limit
from app.jobs.schemas import JobStatus
from app.jobs.tables import Job


def fair_pick(limits: Limits) -> Any:
    """A query for the id of the job to start next (no row: nothing may start)."""
    running = running_counts()
    active = func.coalesce(running.c.running, 0)
    queued = (
        select(
            Job.id,
            active.label("running"),
            func.min(Job.queued_at).over(partition_by=Job.team_id).label("team_waiting_since"),
            func.row_number()
            .over(
                partition_by=Job.team_id,
                order_by=(Job.priority.desc(), Job.queued_at, Job.id),
            )
            .label("place"),
        )
        .join(Team, Team.id == Job.team_id)
        .outerjoin(running, running.c.team_id == Job.team_id)
        .where(Job.status == JobStatus.queued, active < running_limit(limits))
        .subquery()
    )
    return (
        select(queued.c.id)
        .where(queued.c.place == 1)
        .order_by(queued.c.running, queued.c.team_waiting_since, queued.c.id)
        .limit(1)
    )
