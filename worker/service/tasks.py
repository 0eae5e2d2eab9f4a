"""The arq task `run_job`: claim a job, run the engine, record the outcome; then the next.

A message says a slot should run something; the database decides what. The task takes
over the named job if its worker died, else starts the job fair dispatch picks
(app/jobs/fairness.py), and when that job ends it starts the next pick, until none is
left (or the worker drains): a freed slot goes to the fairest job at once, whatever
order the messages are in.

The database owns the job: the task claims it with a compare-and-set, beats its heart
while the engine runs, stops at a step boundary when the API asks (cancel, pause) or the
worker shuts down, and ends the job as succeeded, failed, cancelled, paused or requeued.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.auth.job_tokens import JobTokens
from app.budgets.rules import BUDGET_STOP
from app.budgets.service import check_spending
from app.core.config import Settings
from app.core.pricing import PriceTable
from app.core.queue import JobQueue
from app.core.storage import checkpoint_store, file_cache
from app.core.tables import utcnow
from app.jobs.dispatch import enqueue_job
from app.jobs.errors import JobNotHeld, SpecRefused
from app.jobs.limits import Limits, note_limits
from app.jobs.schemas import JobAction
from app.jobs.store import claim_next, complete_job, fail_job, heartbeat, stop_job, take_over
from app.jobs.tables import Job
from app.jobs.weight_paths import checked_weights, written_paths
from app.records.store import sampler_weights
from app.usage.store import models_of
from kernel.errors import OPDError, ResultLost, ServerAway
from kernel.progress import JobProgress
from kernel.spec import JobSpec, stored_spec
from kernel.spec.checks import unlisted_teacher_server
from kernel.storage.blobs import StorageUnavailable
from kernel.team_view import in_team_words
from worker.engine.backends.server import ServerKey
from worker.engine.loop.job import run_job as run_engine
from worker.engine.loop.schedule import resume_versions
from worker.engine.loop.state import RunResult, SavedState, Stop
from worker.engine.tracking.mlflow_mirror import MlflowSink
from worker.engine.tracking.sinks import FanOut, InTeamWords, Sink, SwanLabSink
from worker.service.db_sink import DatabaseSink, Spending, persist
from worker.service.sight import DatabaseSight, blind_after
from worker.service.trackers import mlflow_mirror

log = logging.getLogger(__name__)
SHUTDOWN = "the worker is shutting down"


@dataclass
class JobControl:
    """What the engine's `should_stop` reads: why the run should stop, if it should, and
    whether for good (a cancel, which beats any other reason)."""

    reason: str | None = None
    cancel: bool = False
    lost: bool = False
    failure: BaseException | None = None
    engine: asyncio.Task[RunResult] | None = field(default=None, repr=False)

    def request(self, reason: str) -> None:
        self.reason = self.reason or reason

    def ask(self, action: JobAction) -> None:
        """The API's cancel or pause, relayed by a heartbeat or a step's write."""
        self.cancel = self.cancel or action is JobAction.cancel
        self.request(str(action))

    def should_stop(self) -> Stop | None:
        if self.cancel:
            return Stop.cancel
        return None if self.reason is None else Stop.resume

    def take_away(self) -> None:
        """Another worker holds the job now: stop at once, write nothing more."""
        self.lost = True
        self.halt()

    def fail(self, error: BaseException) -> None:
        """The run cannot be recorded (the database refuses a write): stop at once."""
        self.failure = error
        self.halt()

    def halt(self) -> None:
        if self.engine is not None:
            self.engine.cancel()


@dataclass
class WorkerContext:
    """What every task of one worker process shares (arq's ctx["opd"])."""

    settings: Settings
    sessions: async_sessionmaker[AsyncSession]
    queue: JobQueue
    worker_id: str
    running: dict[int, JobControl] = field(default_factory=dict)
    draining: bool = False
    on_transition: Callable[[], None] = lambda: None
    """Called after this worker ended an attempt (a webhook may be due: send it now)."""
    mirrors: set[MlflowSink] = field(default_factory=set)
    """MLflow mirrors still sending (they outlive their attempt while the tracker is away)."""
    sight: DatabaseSight = field(init=False)
    """What the requeuer saw of the database: a job is taken over only once it saw it for
    a heartbeat timeout (worker/service/sight.py)."""

    def __post_init__(self) -> None:
        settings = self.settings
        self.sight = DatabaseSight(
            blind_after(settings.heartbeat_timeout, settings.requeue_interval)
        )


async def saved_state(ctx: WorkerContext, job: Job, spec: JobSpec) -> SavedState | None:
    """Where a claimed job resumes: its last recorded state, at the step the row says, and
    (with loop.max_steps_off_policy) the sampler weights its next steps sample from."""
    if job.last_state_path is None or job.last_state_step is None:
        return None
    samplers: dict[int, str] = {}
    if needed := resume_versions(job.last_state_step, spec.loop):
        async with ctx.sessions() as session:
            samplers = await sampler_weights(session, job.id, set(needed))
    return SavedState(job.last_state_path, job.last_state_step, samplers)


async def loadable(ctx: WorkerContext, job: Job) -> JobSpec:
    """The job's spec, its weights paths checked against its team once more before anything
    is loaded (the files may have changed since it was submitted, or the rules)."""
    spec = stored_spec(job.spec)
    return await write(
        ctx,
        f"check the weights of job {job.id}",
        lambda s: checked_weights(s, job.team_id, spec, ctx.settings),
    )


def failure_of(error: BaseException) -> tuple[str, str]:
    """(code, message) for a job that failed with `error`: what a person can act on."""
    if isinstance(error, OPDError):
        return error.code, str(error)
    return "internal_error", f"{type(error).__name__}: {error}"


class Heartbeat:
    """Beats a job's heart every interval while its attempt runs (with what the run does
    now, `progress`), relays cancel and pause requests, and notices a takeover. `stop` lets
    the beat in flight finish: a heartbeat cancelled inside its UPDATE would invalidate its
    connection mid-transaction (on SQLite holding the write lock), and the error its
    cleanup raises would swallow the cancel."""

    def __init__(
        self,
        ctx: WorkerContext,
        job_id: int,
        control: JobControl,
        progress: Callable[[], JobProgress | None] = lambda: None,
    ) -> None:
        self.ctx, self.job_id, self.control, self.progress = ctx, job_id, control, progress
        self.stopped = asyncio.Event()
        self.task = asyncio.create_task(self.beat_until_stopped(), name=f"heartbeat-{job_id}")

    async def beat_until_stopped(self) -> None:
        ctx = self.ctx
        while not await self.stop_within(ctx.settings.heartbeat_interval):
            try:
                async with ctx.sessions() as session:
                    action = await heartbeat(session, self.job_id, ctx.worker_id, self.progress())
            except JobNotHeld:
                self.control.take_away()
                return
            except Exception as error:  # the database may be away: keep beating
                log.warning("job %s heartbeat failed: %s", self.job_id, error)
                continue
            if action is not None:
                self.control.ask(action)

    async def stop_within(self, seconds: float) -> bool:
        """Whether `stop` was asked within `seconds`."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stopped.wait(), seconds)
        return self.stopped.is_set()

    async def stop(self) -> None:
        """Stop beating once the beat in flight, if any, has ended."""
        self.stopped.set()
        await self.task


async def write(ctx: WorkerContext, what: str, operation: Any) -> Any:
    """A job-state write that waits out a database outage rather than losing the outcome."""
    return await persist(ctx.sessions, what, operation)


def teacher_server_keys(spec: JobSpec, settings: Settings, job: Job) -> dict[str, ServerKey]:
    """The key the operator bound to each of the spec's teacher servers (OPD_TEACHER_SERVERS
    names the worker's variable holding it), by URL: only from that binding, never from a
    variable a spec names; a bound variable that is unset sends no key. A server bound to
    `self` (this service's own /v1) gets a maker of short-lived tokens of `job` and its
    team, never a key of the worker's."""
    keys: dict[str, ServerKey] = {}
    for teacher in spec.teacher_specs().values():
        if teacher.server is None:
            continue
        url = teacher.server.url
        name = settings.teacher_server_key_env(url)
        if settings.serves_itself(url):
            keys[url] = job_token_maker(settings, job)
        elif name and (key := os.environ.get(name)):
            keys[url] = key
    return keys


def teacher_replicas(spec: JobSpec, settings: Settings) -> dict[str, list[str]]:
    """The replicas behind each of the spec's teacher servers (OPD_TEACHER_REPLICAS), by
    the URL the spec writes; a server without any is left out."""
    urls = {t.server.url for t in spec.teacher_specs().values() if t.server is not None}
    return {url: replicas for url in urls if (replicas := settings.replicas_of(url))}


def job_token_maker(settings: Settings, job: Job) -> Callable[[], str]:
    """What mints a fresh token of `job` for each request to this service's own /v1."""
    tokens, team_id, job_id = JobTokens.of(settings), job.team_id, job.id
    assert job_id is not None
    return lambda: tokens.issue(team_id, job_id, time.time())


async def execute(ctx: WorkerContext, job: Job, control: JobControl) -> str:
    """Run a claimed job to its end and record that end; returns the outcome's name. Its
    MLflow mirror, if any, learns the outcome and goes on sending in the background."""
    job_id, worker = job.id, ctx.worker_id
    try:
        spec = await loadable(ctx, job)
    except SpecRefused as refused:
        message = str(refused)
        await write(
            ctx,
            f"fail job {job_id}",
            lambda s: fail_job(s, job_id, worker, "bad_model_path", message),
        )
        return "failed"
    if unlisted := unlisted_teacher_server(spec, ctx.settings.teacher_servers):
        # The operator's list may have shrunk since the job was submitted.
        refusal = f"{unlisted[0]}: {unlisted[1]}"
        await write(
            ctx,
            f"fail job {job_id}",
            lambda s: fail_job(s, job_id, worker, "teacher_server_not_allowed", refusal),
        )
        return "failed"
    prices = PriceTable(ctx.settings.prices)
    verdict = await write(
        ctx,
        f"check the budget of job {job_id}'s team",
        lambda s: check_spending(s, job.team_id, prices, utcnow()),
    )
    if verdict.action is not None:  # the team's budget is spent: pause before step one
        return await stop(ctx, job_id, BUDGET_STOP, None)
    db = DatabaseSink(
        ctx.sessions,
        job_id,
        worker,
        on_action=control.ask,
        on_lost=control.take_away,
        on_failed=control.fail,
        spending=Spending(job.team_id, prices, models_of(job.spec), verdict.budgeted),
    )
    mirror = mlflow_mirror(ctx.settings, ctx.sessions, job, spec, db)
    if mirror is None:
        return await attempt(ctx, job, control, spec, db, db)
    ctx.mirrors = {other for other in ctx.mirrors if not other.done()} | {mirror}
    outcome = "interrupted"
    try:
        outcome = await attempt(ctx, job, control, spec, db, FanOut(db, mirror))
        return outcome
    finally:
        mirror.finish(outcome)


async def attempt(
    ctx: WorkerContext, job: Job, control: JobControl, spec: JobSpec, db: DatabaseSink, sink: Sink
) -> str:
    """One attempt: the engine reports to `sink` (the database's, fanned out to the job's
    trackers), then the end is recorded once the database holds every step."""
    job_id, worker = job.id, ctx.worker_id
    artifact_dir = ctx.settings.artifact_root / f"job-{job_id}"
    if spec.swanlab.enabled:
        sink = FanOut(sink, SwanLabSink(artifact_dir / "swanlog", team_view=True))
    written = stored_spec(job.spec)
    if words := written_paths(written, spec):  # said as the team wrote them, wherever said
        sink = InTeamWords(sink, written, words)
    heart = Heartbeat(ctx, job_id, control, lambda: db.now)
    control.engine = asyncio.create_task(
        run_engine(
            spec,
            sink,
            artifact_dir=artifact_dir,
            data_root=ctx.settings.data_root,
            confine_data=True,
            blobs=file_cache(ctx.settings, job.team_id),
            checkpoints=checkpoint_store(ctx.settings),
            resume=await saved_state(ctx, job, spec),
            should_stop=control.should_stop,
            model_cache=ctx.settings.model_cache,
            server_keys=teacher_server_keys(spec, ctx.settings, job),
            server_replicas=teacher_replicas(spec, ctx.settings),
            vllm_servers=ctx.settings.vllm_tiers(),
        )
    )
    error: BaseException | None = None
    result: RunResult | None = None
    try:
        result = await control.engine
    except asyncio.CancelledError:
        if not (control.lost or control.failure):
            raise
    except Exception as failure:
        log.exception("job %s failed", job_id)
        error = failure
    finally:
        # The job is held until its last writes land: beat while they drain, or a requeuer
        # would take a job over whose writes are merely queued behind a slow database.
        try:
            await db.drain()
        finally:
            await heart.stop()
    if control.lost:
        return "taken over"
    if control.failure is not None:
        error = OPDError(
            f"the worker could not record the run: {control.failure}", code="record_failed"
        )

    if (
        isinstance(error, ResultLost | ServerAway | StorageUnavailable)
        and job.attempts < ctx.settings.max_attempts
    ):
        reason = (
            f"{in_team_words(str(error), words)}. Resuming from the last saved state, so "
            "nothing is applied twice "
            f"(attempt {job.attempts + 1} of at most {ctx.settings.max_attempts})"
        )
        return await stop(ctx, job_id, reason, None)
    if error is not None:
        code, message = failure_of(error)
        message = in_team_words(message, words)
        await write(ctx, f"fail job {job_id}", lambda s: fail_job(s, job_id, worker, code, message))
        return "failed"
    assert result is not None
    if not result.stopped:
        path = result.final_weights_path or ""
        await write(ctx, f"complete job {job_id}", lambda s: complete_job(s, job_id, worker, path))
        return "succeeded"
    return await stop(ctx, job_id, control.reason or SHUTDOWN, result.state)


async def stop(ctx: WorkerContext, job_id: int, reason: str, state: SavedState | None) -> str:
    """End this attempt at a step boundary: cancelled or paused if asked, else back to the
    queue (resuming from `state`, or the last state recorded when None)."""
    stopped = await write(
        ctx,
        f"stop job {job_id}",
        lambda s: stop_job(
            s,
            job_id,
            ctx.worker_id,
            reason=reason,
            state_path=state.path if state else None,
            state_step=state.step if state else None,
        ),
    )
    if stopped.status == "queued":
        async with ctx.sessions() as session:
            await enqueue_job(session, ctx.queue, job_id)
    return str(stopped.status)


async def take(ctx: WorkerContext, job_id: int | None) -> Job | None:
    """The job this slot runs next: `job_id` if its worker died (or None when it needs no
    run; judged only once this process has seen the database for a heartbeat timeout),
    else the queued job fair dispatch picks; None when nothing may start. The queued
    jobs' reasons are brought up to date: whose team's running limit holds them back."""
    limits = Limits.of(ctx.settings)
    timeout = ctx.settings.heartbeat_timeout
    judged = ctx.sight.watched_for(timeout, time.monotonic())
    async with ctx.sessions() as session:
        if job_id is not None and job_id not in ctx.running and judged:
            job = await take_over(session, job_id, ctx.worker_id, heartbeat_timeout=timeout)
            if job is not None:
                return job
        job = await claim_next(session, ctx.worker_id, heartbeat_timeout=timeout, limits=limits)
        await note_limits(session, limits)
        return job


async def run_claimed(ctx: WorkerContext, job: Job) -> str:
    control = ctx.running[job.id] = JobControl()
    try:
        return await execute(ctx, job, control)
    except JobNotHeld:
        return "taken over"
    finally:
        ctx.running.pop(job.id, None)
        ctx.on_transition()


async def run_job(arq_ctx: dict[str, Any], job_id: int) -> str:
    """arq entry point (task name `run_job`, as app.queue enqueues it): run jobs in this
    slot until none may start; returns what became of each."""
    ctx: WorkerContext = arq_ctx["opd"]
    outcomes = []
    job = await take(ctx, job_id)
    while job is not None:
        outcomes.append(f"job {job.id}: {await run_claimed(ctx, job)}")
        job = None if ctx.draining else await take(ctx, None)
    return "; ".join(outcomes) or "nothing to run"


def request_shutdown(ctx: WorkerContext) -> None:
    """Start no new job; ask every running one to stop at its next step boundary and be
    requeued."""
    ctx.draining = True
    for control in ctx.running.values():
        control.request(SHUTDOWN)
