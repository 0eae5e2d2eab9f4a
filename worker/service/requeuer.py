"""The requeuer: re-enqueue jobs the database says should run but no live worker holds.

Redis only carries "run job X" messages and may lose them; a worker may die mid-job.
Every pass sends a fresh message for each queued job whose message is gone and for
each active job whose heartbeat is older than the timeout (a live worker then takes it
over and resumes it from its last saved state). A pass costs one query and one Redis
round trip however many jobs wait; only jobs to send again cost more. Queued jobs of a
team at its running limit get no message: they start when one of the team's jobs ends.
A stale heartbeat counts only once the process has seen the database for a whole
heartbeat timeout (worker/service/sight.py): after a Postgres restart, the live workers'
jobs are not taken for lost.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.core.config import Settings
from app.core.queue import JobQueue, QueueUnavailable
from app.jobs.dispatch import count_resends, requeue_candidates, send_counted
from app.jobs.limits import Limits
from app.jobs.schemas import JobStatus
from worker.service.sight import DatabaseSight

log = logging.getLogger(__name__)


@asynccontextmanager
async def contact(sight: DatabaseSight) -> AsyncIterator[None]:
    """A use of the database, told to `sight` as seen or missed."""
    try:
        yield
    except Exception:
        sight.missed()
        raise
    sight.saw(time.monotonic())


async def requeue_lost(
    sessions: async_sessionmaker[AsyncSession],
    queue: JobQueue,
    settings: Settings,
    sight: DatabaseSight,
) -> list[int]:
    """One pass: list the candidates (one query), ask Redis which queued ones still have
    their message (one round trip), count a send of the rest unless a worker or another
    sender got there first (one statement), and send them. Active jobs are candidates
    only once `sight` has seen the database for a heartbeat timeout. Returns the ids sent."""
    limits = Limits.of(settings)
    async with contact(sight), sessions() as session:
        candidates = await requeue_candidates(
            session,
            heartbeat_timeout=settings.heartbeat_timeout,
            queued_for=settings.requeue_interval,
            limits=limits,
        )
    if not sight.watched_for(settings.heartbeat_timeout, time.monotonic()):
        candidates = [c for c in candidates if c.status == JobStatus.queued]
    queued = [(c.id, c.enqueue_count) for c in candidates if c.status == JobStatus.queued]
    try:
        pending = await queue.pending(queued)
    except QueueUnavailable as error:
        log.warning("requeue pass skipped: %s", error)
        return []
    lost = [c for c in candidates if c.id not in pending]
    if not lost:
        return []
    async with contact(sight), sessions() as session:
        sends = await count_resends(session, lost, settings.heartbeat_timeout)
        sent = await send_counted(session, queue, sends)
    statuses = {c.id: c.status for c in lost}
    for job_id in sent:
        log.info("requeuer re-enqueued job %s (%s)", job_id, statuses[job_id])
    return sent
