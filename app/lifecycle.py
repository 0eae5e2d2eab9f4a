"""The job state machine: every change of a job's state, for the API and the worker alike.

    queued -> running -> succeeded | failed | cancelled
    running -> cancelling -> cancelled      running -> pausing -> paused -> queued (resume)

Each transition is one transaction: a compare-and-set UPDATE of the job row (so two
writers racing on one job cannot both win) plus an event row, stamped with the time.
The worker calls the functions below and never writes SQL of its own; its writes name
its worker id, so a worker whose job was taken over learns it (`JobNotHeld`) and stops.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar

from sqlalchemy import ColumnElement, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from app.models import (
    ACTIVE_STATUSES,
    TERMINAL_STATUSES,
    Checkpoint,
    CheckpointKind,
    Event,
    EventLevel,
    Job,
    JobAction,
    JobStatus,
    StepMetric,
    finite_or_none,
    utcnow,
)
from app.spec import JobSpec

T = TypeVar("T")
CAS_ATTEMPTS = 5
RUNNABLE_STATUSES = ACTIVE_STATUSES | {JobStatus.queued}
RELEASED = {"requested_action": None, "heartbeat_at": None}  # what no longer runs drops


class JobNotFound(LookupError):
    """No job with this id (or none the caller may see)."""


class IllegalTransition(Exception):
    """The job's current status does not allow the change; the message says why."""


class IdempotencyMismatch(ValueError):
    """An Idempotency-Key was reused with a different request body."""


class JobNotHeld(Exception):
    """The worker no longer holds this job: another worker took it over, or it ended."""


@dataclass(frozen=True)
class ActionResult:
    """A job after an API action; `changed` is False for an idempotent repeat."""

    job: Job
    changed: bool


@dataclass(frozen=True)
class Plan:
    """Where one action takes a job from one status, and what the timeline says."""

    target: JobStatus
    message: str
    values: dict[str, Any]


def request_hash(spec: JobSpec) -> str:
    """A digest of the validated spec: equal specs (however formatted) hash alike."""
    canonical = json.dumps(spec.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


# --- reading ----------------------------------------------------------------------------------


def _detach(session: AsyncSession, obj: T) -> T:
    """Returned objects are snapshots: a later rollback in the session cannot expire them
    (reading an expired attribute would need IO the caller cannot do)."""
    session.expunge(obj)
    return obj


async def get_job(session: AsyncSession, job_id: int, team_id: int | None = None) -> Job:
    """The job, read fresh from the database; `team_id` None means any team (admin)."""
    query = select(Job).where(Job.id == job_id).execution_options(populate_existing=True)
    if team_id is not None:
        query = query.where(Job.team_id == team_id)
    job = (await session.execute(query)).scalar_one_or_none()
    if job is None:
        raise JobNotFound(f"job {job_id} not found")
    return _detach(session, job)


# --- writing, shared --------------------------------------------------------------------------


def _event(
    job_id: int,
    message: str,
    level: EventLevel = EventLevel.info,
    data: dict[str, Any] | None = None,
    now: datetime | None = None,
) -> Event:
    return Event(job_id=job_id, level=level, message=message, data=data, created_at=now or utcnow())


async def _compare_and_set(
    session: AsyncSession,
    job: Job,
    plan: Plan,
    *extra_where: ColumnElement[bool],
    event_level: EventLevel = EventLevel.info,
    event_data: dict[str, Any] | None = None,
) -> bool:
    """Move `job` to plan.target if nobody changed it since it was read; commit on success."""
    now = utcnow()
    values = {"status": plan.target, "updated_at": now, **plan.values}
    if plan.target in TERMINAL_STATUSES:
        values.setdefault("finished_at", now)
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
    session.add(_event(job.id, plan.message, event_level, data, now))
    await session.commit()
    return True


async def record_event(
    session: AsyncSession,
    job_id: int,
    level: EventLevel | str,
    message: str,
    data: dict[str, Any] | None = None,
) -> Event:
    """Append one line to the job's timeline."""
    event = _event(job_id, message, EventLevel(level), data)
    session.add(event)
    await session.commit()
    return _detach(session, event)


# --- the API side -----------------------------------------------------------------------------


async def create_job(
    session: AsyncSession,
    team_id: int,
    spec: JobSpec,
    idempotency_key: str | None = None,
) -> ActionResult:
    """Store a new queued job. With an idempotency key already used by this team, return
    that job (`changed` False) if the spec is the same, else raise IdempotencyMismatch."""
    digest = request_hash(spec)
    now = utcnow()
    job = Job(
        team_id=team_id,
        created_at=now,
        updated_at=now,
        name=spec.name,
        spec=spec.model_dump(mode="json"),
        total_steps=spec.loop.steps,
        idempotency_key=idempotency_key,
        request_hash=digest if idempotency_key else None,
    )
    session.add(job)
    try:
        await session.flush()
    except IntegrityError:
        await session.rollback()
        existing = (
            await session.execute(
                select(Job).where(Job.team_id == team_id, Job.idempotency_key == idempotency_key)
            )
        ).scalar_one_or_none()
        if existing is None:
            raise
        if existing.request_hash != digest:
            raise IdempotencyMismatch(
                f"Idempotency-Key {idempotency_key!r} was already used for job {existing.id} "
                "with a different body; use a new key for a new job"
            ) from None
        return ActionResult(_detach(session, existing), changed=False)
    session.add(_event(job.id, "Job created", data={"status": JobStatus.queued}, now=now))
    await session.commit()
    return ActionResult(_detach(session, job), changed=True)


def plan_action(action: JobAction, status: JobStatus) -> Plan | None:
    """What cancel, pause or resume does from `status`: a Plan, None for an idempotent
    repeat, or IllegalTransition with the reason."""
    if action is JobAction.cancel:
        if status in (JobStatus.queued, JobStatus.paused):
            return Plan(
                JobStatus.cancelled,
                f"Cancelled while {status}",
                {"requested_action": None, "queue_reason": None},
            )
        if status in (JobStatus.running, JobStatus.pausing):
            return Plan(
                JobStatus.cancelling,
                "Cancel requested; the worker stops at the next step boundary",
                {"requested_action": JobAction.cancel},
            )
        if status in (JobStatus.cancelling, JobStatus.cancelled):
            return None
        raise IllegalTransition(f"the job is already {status}; there is nothing to cancel")
    if action is JobAction.pause:
        if status is JobStatus.queued:
            return Plan(
                JobStatus.paused,
                "Paused while queued",
                {"requested_action": None, "queue_reason": None},
            )
        if status is JobStatus.running:
            return Plan(
                JobStatus.pausing,
                "Pause requested; the worker saves state at the next step boundary",
                {"requested_action": JobAction.pause},
            )
        if status in (JobStatus.pausing, JobStatus.paused):
            return None
        if status is JobStatus.cancelling:
            raise IllegalTransition("the job is being cancelled; it cannot be paused")
        raise IllegalTransition(
            f"the job is already {status}; only a queued or running job can be paused"
        )
    if status is JobStatus.paused:
        return Plan(
            JobStatus.queued,
            "Resumed; waiting for a worker",
            {"requested_action": None, "queue_reason": None},
        )
    if status is JobStatus.pausing:
        return Plan(
            JobStatus.running, "Resumed before the pause took effect", {"requested_action": None}
        )
    if status in (JobStatus.queued, JobStatus.running):
        return None
    if status is JobStatus.cancelling:
        raise IllegalTransition("the job is being cancelled; it cannot be resumed")
    raise IllegalTransition(f"the job is already {status}; submit a new job to run it again")


async def apply_action(
    session: AsyncSession,
    job_id: int,
    action: JobAction,
    team_id: int | None = None,
) -> ActionResult:
    """Cancel, pause or resume a job (see `plan_action`); raises JobNotFound or
    IllegalTransition. A resumed job is `queued` and still has to be enqueued."""
    for _ in range(CAS_ATTEMPTS):
        job = await get_job(session, job_id, team_id)
        plan = plan_action(action, JobStatus(job.status))
        if plan is None:
            return ActionResult(job, changed=False)
        if await _compare_and_set(session, job, plan):
            return ActionResult(await get_job(session, job_id), changed=True)
    raise IllegalTransition(f"job {job_id} kept changing while it was asked to {action}; retry")


# --- the worker side --------------------------------------------------------------------------


def plan_claim(job: Job, worker_id: str, heartbeat_timeout: float) -> Plan | None:
    """What claiming `job` means: start it, take it over from a dead worker, carry out a
    dead worker's pending cancel or pause, or nothing (None)."""
    status = JobStatus(job.status)
    now = utcnow()
    start = {
        "attempts": job.attempts + 1,
        "worker_id": worker_id,
        "heartbeat_at": now,
        "started_at": job.started_at or now,
        "queue_reason": None,
        "steps_done": job.last_state_step or 0,
    }
    if status is JobStatus.queued:
        return Plan(JobStatus.running, f"Attempt {job.attempts + 1} started on {worker_id}", start)
    stale = job.heartbeat_at is None or job.heartbeat_at < now - timedelta(
        seconds=heartbeat_timeout
    )
    if status not in ACTIVE_STATUSES or not stale:
        return None
    orphan = f"worker {job.worker_id} stopped sending heartbeats"
    released = {**RELEASED, "worker_id": None}
    if status is JobStatus.cancelling:
        return Plan(JobStatus.cancelled, f"Cancelled: {orphan}", released)
    if status is JobStatus.pausing:
        return Plan(JobStatus.paused, f"Paused: {orphan}", released)
    return Plan(
        JobStatus.running, f"Attempt {job.attempts + 1} took over on {worker_id}: {orphan}", start
    )


async def claim_job(
    session: AsyncSession,
    job_id: int,
    worker_id: str,
    *,
    heartbeat_timeout: float,
) -> Job | None:
    """Take a job to run: a queued one, or an active one whose worker sent no heartbeat for
    `heartbeat_timeout` seconds (a crash). Returns the job, now `running` with attempts + 1
    (resume it from `last_state_path` when set), or None when there is nothing to run:
    the job ended, is paused, or a live worker holds it."""
    for _ in range(CAS_ATTEMPTS):
        try:
            job = await get_job(session, job_id)
        except JobNotFound:
            return None
        plan = plan_claim(job, worker_id, heartbeat_timeout)
        if plan is None:
            return None
        event_data = {"worker_id": worker_id, "resume_from": job.last_state_path}
        if await _compare_and_set(session, job, plan, event_data=event_data):
            return await get_job(session, job_id) if plan.target is JobStatus.running else None
    return None


def _held(job_id: int, worker_id: str) -> tuple[ColumnElement[bool], ...]:
    return (Job.id == job_id, Job.worker_id == worker_id, Job.status.in_(ACTIVE_STATUSES))


async def heartbeat(session: AsyncSession, job_id: int, worker_id: str) -> JobAction | None:
    """Mark the job alive; returns the action the API requested (cancel/pause) or None."""
    result = await session.execute(
        update(Job)
        .where(*_held(job_id, worker_id))
        .values(heartbeat_at=utcnow())
        .returning(Job.requested_action)
    )
    row = result.one_or_none()
    await session.commit()
    if row is None:
        raise JobNotHeld(f"job {job_id} is no longer held by {worker_id}")
    return None if row.requested_action is None else JobAction(row.requested_action)


def _upsert_metrics(
    dialect: str, job_id: int, step: int, metrics: dict[str, Any], now: datetime
) -> Any:
    """INSERT .. ON CONFLICT (job_id, step) DO UPDATE, spelled for the session's database."""
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    statement = insert(StepMetric).values(
        job_id=job_id, step=step, metrics=metrics, recorded_at=now
    )
    return statement.on_conflict_do_update(
        index_elements=["job_id", "step"],
        set_={"metrics": statement.excluded.metrics, "recorded_at": statement.excluded.recorded_at},
    )


async def record_step(
    session: AsyncSession,
    job_id: int,
    worker_id: str,
    step: int,
    metrics: dict[str, float],
) -> JobAction | None:
    """Store step `step`'s metrics (a replayed step overwrites its row), advance
    steps_done to step + 1 and beat, in one transaction. Returns the requested action."""
    now = utcnow()
    result = await session.execute(
        update(Job)
        .where(*_held(job_id, worker_id))
        .values(steps_done=step + 1, heartbeat_at=now, updated_at=now)
        .returning(Job.requested_action)
    )
    row = result.one_or_none()
    if row is None:
        await session.rollback()
        raise JobNotHeld(f"job {job_id} is no longer held by {worker_id}")
    clean = {name: finite_or_none(value) for name, value in metrics.items()}
    dialect = (await session.connection()).dialect.name
    await session.execute(_upsert_metrics(dialect, job_id, step, clean, now))
    await session.commit()
    return None if row.requested_action is None else JobAction(row.requested_action)


async def record_checkpoint(
    session: AsyncSession,
    job_id: int,
    worker_id: str,
    step: int,
    kind: CheckpointKind | str,
    path: str,
) -> Checkpoint:
    """Record saved weights; a `state` becomes the resume point, a `final` the result."""
    kind = CheckpointKind(kind)
    now = utcnow()
    values: dict[str, Any] = {"heartbeat_at": now}
    if kind is CheckpointKind.state:
        values.update(last_state_path=path, last_state_step=step)
    elif kind is CheckpointKind.final:
        values.update(final_weights_path=path)
    result = await session.execute(update(Job).where(*_held(job_id, worker_id)).values(**values))
    if result.rowcount != 1:
        await session.rollback()
        raise JobNotHeld(f"job {job_id} is no longer held by {worker_id}")
    checkpoint = Checkpoint(job_id=job_id, step=step, kind=kind, path=path, created_at=now)
    session.add(checkpoint)
    await session.commit()
    return _detach(session, checkpoint)


async def _finish(
    session: AsyncSession, job_id: int, worker_id: str, decide: Callable[[Job], Plan], **event: Any
) -> Job:
    """Apply the plan `decide(job)` returns to a job this worker holds."""
    for _ in range(CAS_ATTEMPTS):
        job = await get_job(session, job_id)
        if job.worker_id != worker_id or JobStatus(job.status) not in ACTIVE_STATUSES:
            raise JobNotHeld(f"job {job_id} is no longer held by {worker_id}")
        plan = decide(job)
        if await _compare_and_set(session, job, plan, Job.worker_id == worker_id, **event):
            return await get_job(session, job_id)
    raise JobNotHeld(f"job {job_id} kept changing under {worker_id}")


async def complete_job(
    session: AsyncSession, job_id: int, worker_id: str, final_weights_path: str
) -> Job:
    """The run finished every step: succeeded, with the final weights' path."""
    plan = Plan(
        JobStatus.succeeded,
        f"Succeeded; final weights at {final_weights_path}",
        {"final_weights_path": final_weights_path, "steps_done": Job.total_steps, **RELEASED},
    )
    return await _finish(session, job_id, worker_id, lambda _job: plan)


async def fail_job(
    session: AsyncSession, job_id: int, worker_id: str, code: str, message: str
) -> Job:
    """The run failed for a reason a person can act on (`code` is machine-readable)."""
    plan = Plan(
        JobStatus.failed,
        f"Failed ({code}): {message}",
        {"error_code": code, "error_message": message, **RELEASED},
    )
    return await _finish(
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
    """The worker stopped the run at a step boundary (state saved at `state_step`). The
    job's request decides what that means: cancel -> cancelled, pause -> paused, none
    (the worker is shutting down) -> queued again with `reason`, to be enqueued."""

    def decide(job: Job) -> Plan:
        values: dict[str, Any] = {**RELEASED, "worker_id": None}
        if state_path is not None:
            values.update(last_state_path=state_path, last_state_step=state_step)
        if job.requested_action == JobAction.cancel:
            return Plan(JobStatus.cancelled, "Cancelled at a step boundary", values)
        if job.requested_action == JobAction.pause:
            return Plan(JobStatus.paused, "Paused; state saved for resume", values)
        return Plan(JobStatus.queued, f"Requeued: {reason}", values | {"queue_reason": reason})

    return await _finish(
        session,
        job_id,
        worker_id,
        decide,
        event_data={"state_path": state_path, "state_step": state_step},
    )


async def orphaned_job_ids(
    session: AsyncSession,
    *,
    heartbeat_timeout: float,
    queued_for: float,
) -> list[int]:
    """Jobs the sweeper should (re-)enqueue: active ones without a heartbeat for
    `heartbeat_timeout` seconds, and ones queued for `queued_for` seconds or more."""
    now = utcnow()
    stale_before = now - timedelta(seconds=heartbeat_timeout)
    active = Job.status.in_(ACTIVE_STATUSES) & or_(
        Job.heartbeat_at.is_(None), Job.heartbeat_at < stale_before
    )
    waiting = (Job.status == JobStatus.queued) & (
        Job.updated_at < now - timedelta(seconds=queued_for)
    )
    rows = await session.execute(select(Job.id).where(active | waiting).order_by(Job.id))
    return list(rows.scalars())


async def next_enqueue_count(session: AsyncSession, job_id: int) -> int | None:
    """Count one more send of a job that should run (queued, or active with a dead worker)
    and return the count; None if the job should not run (it ended or is paused)."""
    result = await session.execute(
        update(Job)
        .where(Job.id == job_id, Job.status.in_(RUNNABLE_STATUSES))
        .values(enqueue_count=Job.enqueue_count + 1, queue_reason=None)
        .returning(Job.enqueue_count)
    )
    count = result.scalar_one_or_none()
    await session.commit()
    return count


async def set_queue_reason(session: AsyncSession, job_id: int, reason: str | None) -> None:
    """Say why a queued job waits (e.g. the queue was unreachable); no-op once it left."""
    await session.execute(
        update(Job)
        .where(Job.id == job_id, Job.status == JobStatus.queued)
        .values(queue_reason=reason)
    )
    await session.commit()
