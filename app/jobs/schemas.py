"""Jobs as the API shows them: their statuses, the actions a client asks of them, and their
events."""

from datetime import datetime
from enum import StrEnum
from typing import Any, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from app.core.pages import Page
from kernel.progress import JobProgress
from kernel.spec import JobSpec
from kernel.summary import JobSummary


class TokenUsage(BaseModel):
    """Tokens a job used, each replayed step counted once (as its metric row is)."""

    sampled_tokens: int = Field(0, description="Completion tokens the student sampled.")
    teacher_tokens: int = Field(0, description="Prompt + completion tokens the teacher scored.")
    trained_tokens: int = Field(0, description="Tokens of the datums trained on.")
    eval_tokens: int = Field(0, description="Tokens the held-out evals sampled and scored.")


class JobUsage(TokenUsage):
    estimated_cost: float | None = Field(
        None,
        description="From the service's price table; null without one, or when a price this "
        "usage needs is missing (never a guess).",
    )


class JobStatus(StrEnum):
    queued = "queued"
    running = "running"
    cancelling = "cancelling"
    pausing = "pausing"
    paused = "paused"
    succeeded = "succeeded"
    failed = "failed"
    cancelled = "cancelled"


TERMINAL_STATUSES = frozenset({JobStatus.succeeded, JobStatus.failed, JobStatus.cancelled})

ACTIVE_STATUSES = frozenset({JobStatus.running, JobStatus.cancelling, JobStatus.pausing})


class JobAction(StrEnum):
    """What a client asks of a job. Cancel and pause are also what a running job's worker
    is asked (`Job.requested_action`) to do at its next step boundary."""

    cancel = "cancel"
    pause = "pause"
    resume = "resume"


class EventLevel(StrEnum):
    debug = "debug"
    info = "info"
    warning = "warning"
    error = "error"


class JobError(BaseModel):
    code: str
    message: str


class QueuePlace(BaseModel):
    """Where a queued job stands: its place in the order fair dispatch starts the queued
    jobs (as if none ended and none were submitted), what runs now and the worker slots."""

    position: int | None = Field(
        description="1: the next to start; null: behind more queued jobs than one read takes."
    )
    ahead: int = Field(description="Queued jobs that start before it.")
    ahead_in_team: int = Field(description="Of them, its own team's.")
    running: int = Field(description="Jobs running on the service now.")
    running_in_team: int = Field(description="Of them, its own team's.")
    slots: int | None = Field(
        description="Jobs the live workers can run at once (OPD_WORKER_CONCURRENCY each); "
        "null: no worker was seen lately."
    )
    held_by_team_limit: bool = Field(
        description="Its team runs as many jobs as it may (`max_running`): it starts when one "
        "of them ends."
    )


class JobPublic(BaseModel):
    """A job as the API shows it."""

    model_config = ConfigDict(from_attributes=True)

    id: int
    team_id: int
    name: str = Field(description="The spec's name.")
    status: JobStatus
    spec: JobSpec = Field(description="The validated spec, defaults filled in.")
    created_at: datetime
    updated_at: datetime = Field(description="Last change of state or progress.")
    started_at: datetime | None = Field(description="When the first attempt started.")
    finished_at: datetime | None = Field(description="When the job reached its final status.")
    steps_done: int = Field(description="Steps finished by the current attempt's run.")
    total_steps: int
    attempts: int = Field(description="Times a worker started (or resumed) the job.")
    heartbeat_at: datetime | None = Field(description="Last sign of life from the worker.")
    worker_id: str | None = Field(description="The worker holding (or that last held) the job.")
    error: JobError | None = Field(description="Why the job failed, for a person to act on.")
    final_weights_path: str | None = Field(description="The trained weights, once succeeded.")
    last_state_path: str | None = Field(description="The saved state a resume continues from.")
    last_state_step: int | None = Field(description="Steps done when that state was saved.")
    queue_reason: str | None = Field(
        description="Why a queued job is still waiting (always said while it is queued)."
    )
    queue: QueuePlace | None = Field(
        None,
        description="While it is queued: its place in the queue, the jobs ahead of it "
        "and the worker slots.",
    )
    priority: int = Field(description="Orders the job among its own team's queued jobs only.")
    mlflow_run_id: str | None = Field(
        None, description="The MLflow run it is mirrored into (trackers.mlflow), once opened."
    )
    usage: JobUsage
    sweep_id: int | None = Field(None, description="The sweep this job is a trial of.")
    sweep_trial: int | None = Field(None, description="Its trial number in that sweep.")
    stop_reason: str | None = Field(
        None,
        description="`early_stopped`: its sweep cancelled it (its state is kept); "
        "`budget`: its team's budget paused it, and it resumes by itself when the budget "
        "is raised or the period turns.",
    )
    progress: JobProgress | None = Field(
        None,
        description="While it runs: what it does now (a step, or a held-out eval and how many "
        "of its prompts are answered) and the time left, evals included; as its last "
        "heartbeat said it.",
    )
    summary: JobSummary = Field(
        description="Reverse KL first and last; held-out eval accuracy and KL before and "
        "after; the teacher's baseline (each present once recorded)."
    )

    @model_validator(mode="after")
    def _progress_while_running(self) -> Self:
        """A job that no longer runs does nothing now, whatever its last heartbeat said."""
        if self.status not in ACTIVE_STATUSES:
            self.progress = None
        return self


class JobsPage(Page[JobPublic]):
    """Newest first; pass `next_cursor` as `after` to get the next page."""


class EventPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    created_at: datetime
    level: EventLevel
    message: str
    data: dict[str, Any] | None


class EventsPage(Page[EventPublic]):
    """Oldest first; pass `next_cursor` as `after` to get the next page."""


class CheckpointKind(StrEnum):
    state = "state"
    sampler = "sampler"
    final = "final"


class CheckpointPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    step: int
    kind: CheckpointKind
    path: str
    created_at: datetime


class CheckpointsPage(Page[CheckpointPublic]):
    """Oldest first; pass `next_cursor` as `after` to get the next page."""
