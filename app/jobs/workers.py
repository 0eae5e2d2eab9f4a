"""The workers' own rows (each notes its slots as it starts and on every requeue pass, and
leaves as it stops), and the read of the queue that says where each queued job stands
(app/jobs/places.py decides from it)."""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import delete, func, select
from sqlalchemy.ext.asyncio import AsyncSession

from app.auth.tables import Team
from app.jobs.limits import Limits, running_counts, running_limit
from app.jobs.places import QueueBoard, Waiting, start_order
from app.jobs.schemas import JobStatus
from app.jobs.tables import Job, Worker

MAX_READ = 10_000
"""Queued jobs one read of the queue takes (the longest waiting): those queued after them
are said to wait behind more than that."""
FORGOTTEN_AFTER = timedelta(days=1)
"""A worker unseen for this long (it died without leaving) loses its row."""


async def note_worker(session: AsyncSession, worker_id: str, slots: int, now: datetime) -> None:
    """Say that the worker is alive with its slots (and forget workers long gone). Commits."""
    row = await session.get(Worker, worker_id)
    if row is None:
        session.add(Worker(id=worker_id, slots=slots, seen_at=now))
    else:
        row.slots, row.seen_at = slots, now
    await session.execute(delete(Worker).where(Worker.seen_at < now - FORGOTTEN_AFTER))
    await session.commit()


async def forget_worker(session: AsyncSession, worker_id: str) -> None:
    """The worker stops: its slots are gone. Commits."""
    await session.execute(delete(Worker).where(Worker.id == worker_id))
    await session.commit()


async def read_board(session: AsyncSession, limits: Limits, live_since: datetime) -> QueueBoard:
    """The queue as it is now: the queued jobs (the MAX_READ longest waiting) in the order
    they start, the jobs each team runs, and the slots of the workers seen since
    `live_since`."""
    queued = [
        Waiting(*row)
        for row in await session.execute(
            select(Job.id, Job.team_id, Job.priority, Job.queued_at)
            .where(Job.status == JobStatus.queued)
            .order_by(Job.queued_at, Job.id)
            .limit(MAX_READ)
        )
    ]
    counts = running_counts()
    running = {
        team_id: count
        for team_id, count in await session.execute(select(counts.c.team_id, counts.c.running))
    }
    team_ids = {job.team_id for job in queued}
    team_limits = {
        team_id: limit
        for team_id, limit in await session.execute(
            select(Team.id, running_limit(limits)).where(Team.id.in_(team_ids))
        )
    }
    slots = (
        await session.execute(select(func.sum(Worker.slots)).where(Worker.seen_at >= live_since))
    ).scalar_one()
    order, held = start_order(queued, running, team_limits)
    return QueueBoard.of(order, held, running, None if slots is None else int(slots))
