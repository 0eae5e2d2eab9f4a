"""The sweep controller, a periodic task of every worker (beside the requeuer): each pass
takes the lease of the running sweeps no live controller holds, advances each one
(app/sweeps/control.py) and sends the trials it created to the queue.

It lives in the worker because the worker already is the process that must be running
for a sweep to make progress, and already runs the loops that repair lost state (the
requeuer); every worker runs it, the lease gives each sweep one controller at a time, and
when that worker dies its lease runs out and another worker's controller carries on.

It runs on a thread of its own, with its own event loop, database engine and queue
connection: whatever a pass computes (the rows it reads, TPE's suggestions, the judging
of rungs) never holds up the worker's loop, which beats for the running jobs and answers
the playground. A pass also stops taking up work after PASS_SECONDS; the next one starts
with the sweep after the last it advanced, so every sweep gets its turn.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.core.config import Settings
from app.core.db import service_engine, session_factory
from app.core.queue import JobQueue
from app.jobs.dispatch import enqueue_job
from app.jobs.limits import Limits
from app.sweeps.control import advance, cancel_stray_trials, claim_sweeps

log = logging.getLogger(__name__)
PASS_SECONDS = 1.0
"""The work one pass takes up: past it, the pass advances no further sweep and judges no
further rung (what is left waits for the next pass, an interval later)."""
STOP_SECONDS = 10.0


@dataclass
class PassResult:
    created: list[int]
    """The trial jobs created."""
    last: int | None
    """The last sweep advanced (None: none was)."""


def rotated(sweep_ids: list[int], after: int | None) -> list[int]:
    """The sweeps in id order, starting after `after` and wrapping around."""
    if after is None:
        return sweep_ids
    return [s for s in sweep_ids if s > after] + [s for s in sweep_ids if s <= after]


async def control_sweeps(
    sessions: async_sessionmaker[AsyncSession],
    queue: JobQueue,
    settings: Settings,
    owner: str,
    after: int | None = None,
    budget: float | None = PASS_SECONDS,
) -> PassResult:
    """One pass over the sweeps this worker holds (or can take), starting after sweep
    `after`, taking up work for `budget` seconds (None: no limit). A trial whose message
    fails to send waits for the requeuer."""
    limits = Limits.of(settings)
    deadline = None if budget is None else time.monotonic() + budget
    done = PassResult([], None)
    async with sessions() as session:
        if stray := await cancel_stray_trials(session):
            log.info("cancelled trials %s of ended sweeps", stray)
        claimed = await claim_sweeps(session, owner, settings.heartbeat_timeout)
        for sweep_id in rotated(claimed, after):
            if deadline is not None and done.last is not None and time.monotonic() > deadline:
                break
            done.last = sweep_id
            try:
                advanced = await advance(session, sweep_id, owner, limits, settings, deadline)
            except Exception:  # one sweep's trouble must not hold up the others
                log.exception("sweep %s: pass failed; the next pass retries", sweep_id)
                await session.rollback()
                continue
            for job_id in advanced.created:
                await enqueue_job(session, queue, job_id)
            done.created.extend(advanced.created)
            if advanced.refused:
                log.info("sweep %s: admission refused trials %s", sweep_id, advanced.refused)
            if advanced.stopped:
                log.info("sweep %s stopped trials %s early", sweep_id, advanced.stopped)
            if advanced.ended:
                log.info("sweep %s %s", sweep_id, advanced.ended)
    return done


async def control_forever(
    sessions: async_sessionmaker[AsyncSession], queue: JobQueue, settings: Settings, owner: str
) -> None:
    after = None
    while True:
        try:
            after = (await control_sweeps(sessions, queue, settings, owner, after)).last
        except Exception as error:  # the database may be away; the next pass retries
            log.warning("sweep control failed: %s", error)
        await asyncio.sleep(settings.sweeps_interval)


class ControllerThread:
    """`control_forever` on a thread of its own, with its own event loop, database engine
    and queue connection; `stop` cancels it at its next await and waits for it."""

    def __init__(self, settings: Settings, owner: str) -> None:
        self.settings = settings
        self.owner = owner
        self.thread = threading.Thread(target=self.run, name="opd-sweep-controller", daemon=True)
        self.started = threading.Event()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.thread.start()
        self.started.wait()

    def run(self) -> None:
        asyncio.run(self.serve())

    async def serve(self) -> None:
        engine = service_engine(self.settings)
        queue = JobQueue(self.settings.redis_url, self.settings.queue_name)
        self.loop = asyncio.get_running_loop()
        self.task = asyncio.current_task()  # type: ignore[assignment]
        self.started.set()
        try:
            with contextlib.suppress(asyncio.CancelledError):
                await control_forever(session_factory(engine), queue, self.settings, self.owner)
        finally:
            await queue.close()
            await engine.dispose()

    def stop(self) -> None:
        if self.thread.is_alive() and self.loop is not None and self.task is not None:
            self.loop.call_soon_threadsafe(self.task.cancel)
        self.thread.join(STOP_SECONDS)
