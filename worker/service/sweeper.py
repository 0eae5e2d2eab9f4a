"""The sweeper: re-enqueue jobs the database says should run but no live worker holds.

Redis only carries "run job X" messages and may lose them; a worker may die mid-job.
Every sweep sends a fresh message for each queued job whose message is gone and for
each active job whose heartbeat is older than the timeout (a live worker then takes it
over and resumes it from its last saved state).
"""

from __future__ import annotations

import logging

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.core.config import Settings
from app.models import ACTIVE_STATUSES, JobStatus, utcnow
from app.queue import JobQueue, QueueUnavailable, enqueue_job
from app.store.dispatch import orphaned_job_ids
from app.store.errors import JobNotFound
from app.store.rows import get_job
from app.store.transitions import heartbeat_stale

log = logging.getLogger(__name__)


async def sweep(
    sessions: async_sessionmaker[AsyncSession], queue: JobQueue, settings: Settings
) -> list[int]:
    """One pass; returns the ids of the jobs it sent again."""
    async with sessions() as session:
        candidates = await orphaned_job_ids(
            session,
            heartbeat_timeout=settings.heartbeat_timeout,
            queued_for=settings.sweep_interval,
        )
    sent = []
    for job_id in candidates:
        async with sessions() as session:
            try:
                job = await get_job(session, job_id)
                if job.status == JobStatus.queued and await queue.is_pending(
                    job_id, job.enqueue_count
                ):
                    continue
                if job.status in ACTIVE_STATUSES and not heartbeat_stale(
                    job, settings.heartbeat_timeout, utcnow()
                ):
                    continue  # a worker claimed it since the candidates were listed
            except (JobNotFound, QueueUnavailable):
                continue
            if await enqueue_job(session, queue, job_id):
                log.info("sweeper re-enqueued job %s (%s)", job_id, job.status)
                sent.append(job_id)
    return sent
