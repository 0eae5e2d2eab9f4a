"""The sweep controller, a periodic task of every worker (beside the sweeper): each pass
takes the lease of the running sweeps no live controller holds, advances each one
(app/store/sweep_control.py) and sends the trials it created to the queue.

It lives in the worker because the worker already is the process that must be running
for a sweep to make progress, and already runs the loops that repair lost state (the
sweeper); every worker runs it, the lease gives each sweep one controller at a time, and
when that worker dies its lease runs out and another worker's controller carries on.
"""

from __future__ import annotations

import asyncio
import logging

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.core.config import Settings
from app.queue import JobQueue, enqueue_job
from app.store.limits import Limits
from app.store.sweep_control import advance, cancel_stray_trials, claim_sweeps

log = logging.getLogger(__name__)


async def control_sweeps(
    sessions: async_sessionmaker[AsyncSession], queue: JobQueue, settings: Settings, owner: str
) -> list[int]:
    """One pass over every sweep this worker holds (or can take); returns the trial jobs
    it created. A trial whose message fails to send waits for the sweeper."""
    limits = Limits.of(settings)
    created = []
    async with sessions() as session:
        if stray := await cancel_stray_trials(session):
            log.info("cancelled trials %s of ended sweeps", stray)
        for sweep_id in await claim_sweeps(session, owner, settings.heartbeat_timeout):
            try:
                done = await advance(session, sweep_id, owner, limits, settings)
            except Exception:  # one sweep's trouble must not hold up the others
                log.exception("sweep %s: pass failed; the next pass retries", sweep_id)
                await session.rollback()
                continue
            for job_id in done.created:
                await enqueue_job(session, queue, job_id)
            created.extend(done.created)
            if done.refused:
                log.info("sweep %s: admission refused trials %s", sweep_id, done.refused)
            if done.stopped:
                log.info("sweep %s stopped trials %s early", sweep_id, done.stopped)
            if done.ended:
                log.info("sweep %s %s", sweep_id, done.ended)
    return created


async def control_forever(
    sessions: async_sessionmaker[AsyncSession], queue: JobQueue, settings: Settings, owner: str
) -> None:
    while True:
        try:
            await control_sweeps(sessions, queue, settings, owner)
        except Exception as error:  # the database may be away; the next pass retries
            log.warning("sweep control failed: %s", error)
        await asyncio.sleep(settings.sweeps_interval)
