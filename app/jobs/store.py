"""A job's state changes, each one transaction: a compare-and-set UPDATE of the job row (so
two writers racing on one job cannot both win) plus an event row, stamped with the time.

Worker writes name the worker's id, so a worker whose job was taken over learns it
(`JobNotHeld`) and stops.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy import ColumnElement, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from app.core.db import commit_or_flush, detach
from app.core.documents import stored_json
from app.core.idempotency import Idempotency, insert_once
from app.core.tables import utcnow
from app.jobs.errors import IllegalTransition, JobNotFound, JobNotHeld
from app.jobs.fairness import fair_pick
from app.jobs.limits import (
    Limits,
    QueueFull,
    check_queued,
    lock_team,
    running_limit_reason,
    under_running_limit,
)
from app.jobs.mlflow_endings import add_mlflow_ending
from app.jobs.rows import event_row, get_job, held
from app.jobs.schemas import ACTIVE_STATUSES, TERMINAL_STATUSES, EventLevel, JobAction, JobStatus
from app.jobs.tables import Job
from app.jobs.transitions import RELEASED, Plan, plan_action, plan_claim, plan_complete, plan_stop
from app.jobs.webhook_events import add_transition_deliveries
from kernel.progress import JobProgress
from kernel.spec import JobSpec

CAS_ATTEMPTS = 5


@dataclass(frozen=True)
class ActionResult:
    """A job after an API action; `changed` is False for an idempotent repeat."""

    job: Job
    changed: bool


async def compare_and_set(
    session: AsyncSession,
    job: Job,
    plan: Plan,
    *extra_where: ColumnElement[bool],
    event_level: EventLevel = EventLevel.info,
    event_data: dict[str, Any] | None = None,
    commit: bool = True,
) -> bool:
    """Move `job` to plan.target if nobody changed it since it was read; commit on success
    (commit=False: the caller commits), with the webhook deliveries and the MLflow run's
    ending the change makes (the outboxes) in the same transaction."""
    now = utcnow()
    values = {"status": plan.target, "updated_at": now, **plan.values}
    if plan.target in TERMINAL_STATUSES:
        values.setdefault("finished_at", now)
    if job.status == JobStatus.paused and plan.target is JobStatus.queued:
        values["queued_at"] = now  # a resumed job waits from now on
    result = await session.execute(
        update(Job)
        .where(
            Job.id == job.id, Job.status == job.status, Job.attempts == job.attempts, *extra_where
        )
        .values(**values)
        .execution_options(synchronize_session=False)
    )
    if result.rowcount != 1:
        await session.rollback()
        return False
    data = {"from": job.status, "to": plan.target, **(event_data or {})}
    session.add(event_row(job.id, plan.message, event_level, data, now))
    await add_transition_deliveries(session, job, plan.target, values, now)
    await add_mlflow_ending(session, job, plan.target, now)
    await commit_or_flush(session, commit)
    return True


# --- the API side -----------------------------------------------------------------------------


async def create_job(
    session: AsyncSession,
    team_id: int,
    spec: JobSpec,
    idempotency: Idempotency | None = None,
    limits: Limits | None = None,
    trial: tuple[int, int] | None = None,
    *,
    commit: bool = True,
) -> ActionResult:
    """Store a new queued job (commit=False: the caller commits). With an idempotency key
    already used by this team, return that job (`changed` False) if the request is the
    same, else raise IdempotencyMismatch. Over the team's queued limit, nothing is stored:
    QueueFull. A spec larger than limits.max_spec_bytes is not stored: TooLargeToStore. A
    sweep's trial names (sweep id, trial number): an IntegrityError if that trial exists
    already."""
    limits = limits or Limits()
    stored = stored_json(spec.model_dump(mode="json"), "the spec", limits.max_spec_bytes)
    await lock_team(session, team_id)
    now = utcnow()
    job = Job(
        team_id=team_id,
        created_at=now,
        updated_at=now,
        queued_at=now,
        name=spec.name,
        spec=stored,
        total_steps=spec.loop.steps,
        priority=spec.priority,
        sweep_id=trial[0] if trial else None,
        sweep_trial=trial[1] if trial else None,
    )
    job, made = await insert_once(session, job, idempotency, "job")
    if not made:
        return ActionResult(job, changed=False)
    try:
        await check_queued(session, team_id, limits)
    except QueueFull:
        await session.rollback()
        raise
    job.queue_reason = await running_limit_reason(session, team_id, limits)
    session.add(event_row(job.id, "Job created", data={"status": JobStatus.queued}, now=now))
    await commit_or_flush(session, commit)
    return ActionResult(detach(session, job), changed=True)


async def apply_action(
    session: AsyncSession,
    job_id: int,
    action: JobAction,
    team_id: int | None = None,
    *,
    commit: bool = True,
) -> ActionResult:
    """Cancel, pause or resume a job (see `plan_action`; commit=False: the caller commits);
    raises JobNotFound or IllegalTransition. A resumed job is `queued` and still has to be
    enqueued."""
    for _ in range(CAS_ATTEMPTS):
        job = await get_job(session, job_id, team_id)
        plan = plan_action(action, JobStatus(job.status), job_id)
        if plan is None:
            return ActionResult(job, changed=False)
        if await compare_and_set(session, job, plan, commit=commit):
            return ActionResult(await get_job(session, job_id), changed=True)
    raise IllegalTransition(f"job {job_id} kept changing while it was asked to {action}; retry")


# --- the worker side --------------------------------------------------------------------------


async def claim_job(
    session: AsyncSession,
    job_id: int,
    worker_id: str,
    *,
    heartbeat_timeout: float,
    limits: Limits | None = None,
) -> Job | None:
    """Take a job to run: a queued one (if its team is under its running limit), or an
    active one whose worker sent no heartbeat for `heartbeat_timeout` seconds (a crash).
    Returns the job, now `running` with attempts + 1 (resume it from `last_state_path` when
    set), or None when there is nothing to run: the job ended, is paused, a live worker
    holds it, or its team runs as many jobs as it may."""
    for _ in range(CAS_ATTEMPTS):
        try:
            job = await get_job(session, job_id)
        except JobNotFound:
            return None
        outcome = await try_claim(session, job, worker_id, heartbeat_timeout, limits or Limits())
        if outcome is not RETRY:
            return outcome
    return None


async def take_over(
    session: AsyncSession, job_id: int, worker_id: str, *, heartbeat_timeout: float
) -> Job | None:
    """`claim_job` for an active job only: a dead worker's job runs again here (or its
    pending cancel or pause is carried out). A queued job is left to fair dispatch."""
    try:
        job = await get_job(session, job_id)
    except JobNotFound:
        return None
    if JobStatus(job.status) not in ACTIVE_STATUSES:
        return None
    return await claim_job(session, job_id, worker_id, heartbeat_timeout=heartbeat_timeout)


RETRY = object()
"""`try_claim` lost a race: read the job again."""


async def try_claim(
    session: AsyncSession, job: Job, worker_id: str, heartbeat_timeout: float, limits: Limits
) -> Any:
    """One compare-and-set claim of `job` as read: the job (running), None (nothing to run)
    or RETRY. Starting a queued job holds its team's row, and the UPDATE itself checks the
    team is under its running limit, so racing workers never start one job too many."""
    plan = plan_claim(job, worker_id, heartbeat_timeout, utcnow())
    if plan is None:
        return None
    extra: list[ColumnElement[bool]] = []
    if job.status == JobStatus.queued:
        await lock_team(session, job.team_id)
        extra.append(under_running_limit(job.team_id, limits))
    event_data = {"worker_id": worker_id, "resume_from": job.last_state_path}
    if await compare_and_set(session, job, plan, *extra, event_data=event_data):
        return await get_job(session, job.id) if plan.target is JobStatus.running else None
    if extra and not await runs_under_limit(session, job.team_id, limits):
        return None
    return RETRY


async def runs_under_limit(session: AsyncSession, team_id: int, limits: Limits) -> bool:
    under = (await session.execute(select(under_running_limit(team_id, limits)))).scalar_one()
    await session.rollback()
    return bool(under)


async def claim_next(
    session: AsyncSession,
    worker_id: str,
    *,
    heartbeat_timeout: float,
    limits: Limits | None = None,
    attempts: int = 4 * CAS_ATTEMPTS,
) -> Job | None:
    """Start the queued job that fair dispatch picks (`fairness.fair_pick`), or None when no
    team with queued jobs is under its running limit. A pick another worker took first is
    followed by the next pick."""
    limits = limits or Limits()
    for _ in range(attempts):
        picked = (await session.execute(fair_pick(limits))).scalar_one_or_none()
        if picked is None:
            await session.rollback()
            return None
        try:
            job = await get_job(session, picked)
        except JobNotFound:
            continue
        outcome = await try_claim(session, job, worker_id, heartbeat_timeout, limits)
        if outcome is not RETRY and outcome is not None:
            return outcome
    return None


async def heartbeat(
    session: AsyncSession, job_id: int, worker_id: str, progress: JobProgress | None = None
) -> JobAction | None:
    """Mark the job alive, with what it does now; returns the action the API requested
    (cancel/pause) or None."""
    now = None if progress is None else progress.model_dump(mode="json")
    result = await session.execute(
        update(Job)
        .where(*held(job_id, worker_id))
        .values(heartbeat_at=utcnow(), progress=now)
        .returning(Job.requested_action)
    )
    row = result.one_or_none()
    await session.commit()
    if row is None:
        raise JobNotHeld(f"job {job_id} is no longer held by {worker_id}")
    return None if row.requested_action is None else JobAction(row.requested_action)


async def finish(
    session: AsyncSession, job_id: int, worker_id: str, decide: Callable[[Job], Plan], **event: Any
) -> Job:
    """Apply the plan `decide(job)` returns to a job this worker holds."""
    for _ in range(CAS_ATTEMPTS):
        job = await get_job(session, job_id)
        if job.worker_id != worker_id or JobStatus(job.status) not in ACTIVE_STATUSES:
            raise JobNotHeld(f"job {job_id} is no longer held by {worker_id}")
        plan = decide(job)
        if await compare_and_set(session, job, plan, Job.worker_id == worker_id, **event):
            return await get_job(session, job_id)
    raise JobNotHeld(f"job {job_id} kept changing under {worker_id}")


async def complete_job(
    session: AsyncSession, job_id: int, worker_id: str, final_weights_path: str
) -> Job:
    """The run finished every step: see `plan_complete`."""

    def decide(job: Job) -> Plan:
        plan = plan_complete(job, final_weights_path)
        return Plan(plan.target, plan.message, plan.values | {"steps_done": Job.total_steps})

    data = {"final_weights_path": final_weights_path}  # a team reads it masked
    return await finish(session, job_id, worker_id, decide, event_data=data)


async def fail_job(
    session: AsyncSession, job_id: int, worker_id: str, code: str, message: str
) -> Job:
    """The run failed for a reason a person can act on (`code` is machine-readable)."""
    plan = Plan(
        JobStatus.failed,
        f"Failed ({code}): {message}",
        {"error_code": code, "error_message": message, **RELEASED},
    )
    return await finish(
        session,
        job_id,
        worker_id,
        lambda _job: plan,
        event_level=EventLevel.error,
        event_data={"code": code},
    )


async def stop_job(
    session: AsyncSession,
    job_id: int,
    worker_id: str,
    *,
    reason: str,
    state_path: str | None = None,
    state_step: int | None = None,
) -> Job:
    """The worker stopped the run at a step boundary (state saved at `state_step`); see
    `plan_stop` for what that means for the job."""
    state = (
        {} if state_path is None else {"last_state_path": state_path, "last_state_step": state_step}
    )
    return await finish(
        session,
        job_id,
        worker_id,
        lambda job: plan_stop(job, reason, state),
        event_data={"state_path": state_path, "state_step": state_step},
    )


UNRUN = (
    "Attempt {attempt}'s claim never reached its worker (the database dropped the answer "
    "after committing it); queued again"
)


async def release_unrun(
    session: AsyncSession, worker_id: str, running: Collection[int], older_than: float
) -> list[int]:
    """Jobs the database says `worker_id` holds but none of its slots runs, with no
    heartbeat for `older_than` seconds: a claim whose answer a database restart dropped
    after its commit. The worker stops each as at a step boundary (queued again, or
    cancelled or paused as asked) rather than leave it until its heartbeat is stale and
    another worker takes it over from a live one. Returns the jobs queued again."""
    before = utcnow() - timedelta(seconds=older_than)
    rows = await session.execute(
        select(Job).where(
            Job.worker_id == worker_id,
            Job.status.in_(ACTIVE_STATUSES),
            Job.id.not_in(list(running)),
            Job.heartbeat_at < before,
        )
    )
    queued = []
    for job in list(rows.scalars()):
        plan = plan_stop(job, UNRUN.format(attempt=job.attempts), {})
        same_holder = (Job.worker_id == worker_id, Job.heartbeat_at == job.heartbeat_at)
        if await compare_and_set(session, job, plan, *same_holder):
            queued += [job.id] if plan.target is JobStatus.queued else []
    await session.rollback()
    return queued
