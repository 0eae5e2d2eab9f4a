"""The job state machine as pure decisions: where an action or a claim takes a job.

Nothing here touches the database: `jobs.py` applies a `Plan` with a compare-and-set.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol

from app.jobs.errors import IllegalTransition
from app.jobs.schemas import ACTIVE_STATUSES, JobAction, JobStatus

RUNNABLE_STATUSES = ACTIVE_STATUSES | {JobStatus.queued}
RELEASED = {"requested_action": None, "heartbeat_at": None}  # what no longer runs drops


@dataclass(frozen=True)
class Plan:
    """Where one action takes a job from one status, and what the timeline says."""

    target: JobStatus
    message: str
    values: dict[str, Any]


def plan_action(action: JobAction, status: JobStatus, job_id: int | None = None) -> Plan | None:
    """What cancel, pause or resume does from `status`: a Plan, None for an idempotent
    repeat, or IllegalTransition with the reason (and, for job `job_id`, what to do)."""
    if action is JobAction.cancel:
        return plan_cancel(status)
    if action is JobAction.pause:
        return plan_pause(status)
    return plan_resume(status, job_id)


def plan_cancel(status: JobStatus) -> Plan | None:
    if status in (JobStatus.queued, JobStatus.paused):
        return Plan(
            JobStatus.cancelled,
            f"Cancelled while {status}",
            {"requested_action": None, "queue_reason": None, "stop_reason": None},
        )
    if status in (JobStatus.running, JobStatus.pausing):
        return Plan(
            JobStatus.cancelling,
            "Cancel requested; the worker stops at the next step boundary",
            {"requested_action": JobAction.cancel, "stop_reason": None},
        )
    if status in (JobStatus.cancelling, JobStatus.cancelled):
        return None
    raise IllegalTransition(f"the job is already {status}; there is nothing to cancel")


def plan_pause(status: JobStatus) -> Plan | None:
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


def plan_resume(status: JobStatus, job_id: int | None = None) -> Plan | None:
    if status is JobStatus.paused:
        return Plan(
            JobStatus.queued,
            "Resumed; waiting for a worker",
            {"requested_action": None, "queue_reason": None, "stop_reason": None},
        )
    if status is JobStatus.pausing:
        return Plan(
            JobStatus.running,
            "Resumed before the pause took effect",
            {"requested_action": None, "stop_reason": None},
        )
    if status in (JobStatus.queued, JobStatus.running):
        return None
    if status is JobStatus.cancelling:
        raise IllegalTransition("the job is being cancelled; it cannot be resumed")
    job = "ID" if job_id is None else str(job_id)
    raise IllegalTransition(
        f"the job is already {status}; an ended job is not resumed. Clone it to run it "
        f"again: `opd clone {job}` (POST /v1/jobs/{job}/clone), and `opd clone {job} "
        "--init-from N` continues from the state it saved after step N"
    )


class JobRow(Protocol):
    """What a claim, a stop or a completion reads of a job's row."""

    status: str
    attempts: int
    worker_id: str | None
    heartbeat_at: datetime | None
    started_at: datetime | None
    last_state_step: int | None
    requested_action: str | None
    stop_reason: str | None


def heartbeat_stale(job: JobRow, heartbeat_timeout: float, now: datetime) -> bool:
    """No sign of life from the job's worker for `heartbeat_timeout` seconds."""
    return job.heartbeat_at is None or job.heartbeat_at < now - timedelta(seconds=heartbeat_timeout)


def plan_claim(job: JobRow, worker_id: str, heartbeat_timeout: float, now: datetime) -> Plan | None:
    """What claiming `job` means: start it, take it over from a dead worker, carry out a
    dead worker's pending cancel or pause, or nothing (None)."""
    status = JobStatus(job.status)
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
    if status not in ACTIVE_STATUSES or not heartbeat_stale(job, heartbeat_timeout, now):
        return None
    orphan = f"worker {job.worker_id} stopped sending heartbeats"
    released = {**RELEASED, "worker_id": None}
    if status is JobStatus.cancelling:
        return Plan(JobStatus.cancelled, f"Cancelled: {orphan}", released)
    if status is JobStatus.pausing:  # at its last saved state, where a resume goes on from
        return Plan(
            JobStatus.paused,
            f"Paused at step {job.last_state_step or 0}, its last saved state: {orphan}",
            released | {"steps_done": job.last_state_step or 0},
        )
    return Plan(
        JobStatus.running, f"Attempt {job.attempts + 1} took over on {worker_id}: {orphan}", start
    )


def plan_complete(job: JobRow, final_weights_path: str) -> Plan:
    """The run finished every step and saved its final weights: succeeded, unless a
    person's cancel was accepted after its last step boundary (during the final eval or
    saves), which ends it cancelled with those weights kept, as an accepted cancel
    promises. A pause, or a sweep's early stop (`stop_reason`), asked for that late has
    nothing left to stop: the trial's whole curve counts."""
    values: dict[str, Any] = {"final_weights_path": final_weights_path, **RELEASED}
    if job.requested_action == JobAction.cancel and job.stop_reason is None:
        return Plan(
            JobStatus.cancelled,
            "Cancelled after its last step; final weights saved",
            values,
        )
    return Plan(
        JobStatus.succeeded,
        "Succeeded; final weights saved",
        values | {"stop_reason": None},  # a stop asked for too late did not happen
    )


def plan_stop(job: JobRow, reason: str, state: dict[str, Any]) -> Plan:
    """The worker stopped the run at a step boundary: the job's request decides what that
    means (cancel -> cancelled, pause -> paused, none: the worker is shutting down ->
    queued again with `reason`). `state` holds the saved state's path and step, if any."""
    values: dict[str, Any] = {**RELEASED, "worker_id": None, **state}
    if job.requested_action == JobAction.cancel:
        return Plan(JobStatus.cancelled, "Cancelled at a step boundary", values)
    if job.requested_action == JobAction.pause:
        return Plan(JobStatus.paused, "Paused; state saved for resume", values)
    return Plan(JobStatus.queued, f"Requeued: {reason}", values | {"queue_reason": reason})
