"""The worker process (`opd worker`): an arq worker running `run_job`, plus the requeuer,
the sweep controller (on a thread of its own), the webhook sender, what ends the MLflow
runs of ended jobs, and a second arq worker for the short tasks a request waits for (the
playground, archive fetches: `quick.py`), which keeps answering while jobs drain.

SIGTERM or SIGINT drains the worker: it takes no new job, every running job stops at its
next step boundary with its state saved and goes back to the queue for another worker.
A second signal stops at once (the requeuer later resumes those jobs from their last
saved state).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
from datetime import timedelta

from arq.connections import RedisSettings
from arq.worker import Worker, func
from redis.exceptions import RedisError

import app.tables  # noqa: F401  (every table in the metadata before a flush)
from app.budgets.service import resume_spending
from app.core.config import Settings
from app.core.db import service_engine, session_factory
from app.core.pricing import PriceTable
from app.core.queue import TASK_NAME, JobQueue
from app.core.tables import utcnow
from app.jobs.dispatch import enqueue_job
from app.jobs.store import release_unrun
from app.jobs.workers import forget_worker, note_worker
from worker.service.quick import quick_worker
from worker.service.requeuer import requeue_lost
from worker.service.sweep_controller import ControllerThread
from worker.service.tasks import WorkerContext, request_shutdown, run_job
from worker.service.trackers import end_runs_forever
from worker.service.webhooks import Sender

log = logging.getLogger(__name__)
JOB_TIMEOUT = timedelta(days=30)
REDIS_RETRY_SECONDS = 2.0
MIRROR_GRACE_SECONDS = 10.0


class OPDWorker(Worker):
    """arq's worker, made to outlive Redis outages: jobs keep running (their state lives
    in the database), and a poll that fails because Redis is away is retried later
    instead of ending the process. (Hooks arq's poll step; arq is pinned below 0.29.)"""

    async def _poll_iteration(self) -> None:
        try:
            await super()._poll_iteration()
        except (RedisError, OSError) as error:
            log.warning("Redis unreachable, retrying in %.0fs: %s", REDIS_RETRY_SECONDS, error)
            await asyncio.sleep(REDIS_RETRY_SECONDS)


async def requeue_forever(ctx: WorkerContext) -> None:
    """Every sweep interval: note this worker and its slots (what a queued job says it
    waits for), resume what a team's budget paused wherever the team may spend
    again (the period turned, or its budget was raised while no API process could send
    them), then re-enqueue what the database says should run but no worker holds."""
    while True:
        try:
            async with ctx.sessions() as session:
                await note_worker(session, ctx.worker_id, ctx.settings.worker_concurrency, utcnow())
                prices = PriceTable(ctx.settings.prices)
                for job_id in await resume_spending(session, ctx.queue, prices, utcnow()):
                    log.info("resumed job %s: its team's budget allows it again", job_id)
            await release_claims_never_run(ctx)
            await requeue_lost(ctx.sessions, ctx.queue, ctx.settings, ctx.sight)
        except Exception as error:  # Redis or the database may be away; try next time
            log.warning("requeue pass failed: %s", error)
        await asyncio.sleep(ctx.settings.requeue_interval)


async def release_claims_never_run(ctx: WorkerContext) -> None:
    """Send back to the queue what this worker holds in the database but runs in no slot
    (a claim whose answer a database restart dropped), after half a heartbeat timeout:
    before any other worker would judge it dead and take it over."""
    older_than = ctx.settings.heartbeat_timeout / 2
    async with ctx.sessions() as session:
        for job_id in await release_unrun(session, ctx.worker_id, set(ctx.running), older_than):
            log.info("job %s: its claim never reached this worker; queued again", job_id)
            await enqueue_job(session, ctx.queue, job_id)


async def drain(worker: Worker, ctx: WorkerContext) -> None:
    """Stop picking jobs, ask the running ones to stop and requeue, then end the worker."""
    worker.allow_pick_jobs = False
    request_shutdown(ctx)
    log.info("draining: %d running job(s) stop at their next step boundary", len(ctx.running))
    while any(not task.done() for task in worker.tasks.values()):
        await asyncio.sleep(0.2)
    # What the MLflow mirrors still hold gets a short while to go out (a tracker that is
    # away does not hold the shutdown up).
    await asyncio.gather(*(mirror.flushed(MIRROR_GRACE_SECONDS) for mirror in ctx.mirrors))
    if worker.main_task is not None:
        worker.main_task.cancel()


async def serve_worker(settings: Settings) -> None:
    """Run one worker process until it is signalled to stop."""
    if settings.redis_url is None:
        raise RuntimeError("the worker needs a Redis: set OPD_REDIS_URL")
    if "OPD_SWEEP_INTERVAL" in os.environ:
        log.warning(
            "OPD_SWEEP_INTERVAL is deprecated and goes in the next release: use "
            "OPD_REQUEUE_INTERVAL"
        )
    engine = service_engine(settings)
    ctx = WorkerContext(
        settings=settings,
        sessions=session_factory(engine),
        queue=JobQueue(settings.redis_url, settings.queue_name),
        worker_id=f"{socket.gethostname()}:{os.getpid()}",
    )
    sender = Sender(ctx.sessions, settings, ctx.worker_id)
    ctx.on_transition = sender.wake
    worker = OPDWorker(
        functions=[func(run_job, name=TASK_NAME, max_tries=3)],
        queue_name=settings.queue_name,
        redis_settings=RedisSettings.from_dsn(settings.redis_url),
        max_jobs=settings.worker_concurrency,
        job_timeout=JOB_TIMEOUT,
        handle_signals=False,
        ctx={"opd": ctx},
    )
    quick = quick_worker(settings, OPDWorker)
    loop = asyncio.get_running_loop()
    draining: list[asyncio.Task[None]] = []

    def on_signal(signum: int) -> None:
        if draining:
            log.warning("second %s: stopping now", signal.Signals(signum).name)
            worker.handle_sig(signum)
            return
        draining.append(loop.create_task(drain(worker, ctx)))

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal, signum)
    requeuer = loop.create_task(requeue_forever(ctx))
    controller = ControllerThread(settings, ctx.worker_id)
    controller.start()
    answering = loop.create_task(quick.async_run())
    sending = loop.create_task(sender.run_forever())
    ending = loop.create_task(end_runs_forever(ctx.sessions, settings))
    log.info("worker %s serving queue %s", ctx.worker_id, settings.queue_name)
    try:
        with contextlib.suppress(asyncio.CancelledError):
            await worker.async_run()
    finally:
        requeuer.cancel()
        with contextlib.suppress(Exception):  # the database may be away: the row then ages out
            async with ctx.sessions() as session:
                await forget_worker(session, ctx.worker_id)
        await asyncio.to_thread(controller.stop)
        answering.cancel()
        await quick.close()
        sending.cancel()
        ending.cancel()
        await sender.close()
        await worker.close()
        await ctx.queue.close()
        await engine.dispose()
