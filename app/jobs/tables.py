"""The jobs table, the events a job logs, and the MLflow runs still to end."""

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Index,
    String,
    Text,
    UniqueConstraint,
)
from sqlmodel import Field, SQLModel

from app.core.tables import NEVER_REUSED, optional_timestamp, timestamp
from app.jobs.schemas import JobStatus, JobUsage
from kernel.summary import JobSummary, summary_of_ends


class Job(SQLModel, table=True):
    __tablename__ = "jobs"
    __table_args__ = (
        UniqueConstraint("team_id", "idempotency_key", name="uq_jobs_team_idempotency_key"),
        UniqueConstraint("sweep_id", "sweep_trial", name="uq_jobs_sweep_id_sweep_trial"),
        Index("ix_jobs_team_id_id", "team_id", "id"),
        Index("ix_jobs_team_id_status_id", "team_id", "status", "id"),
        Index("ix_jobs_status", "status"),
        NEVER_REUSED,
    )

    id: int | None = Field(default=None, primary_key=True)
    team_id: int = Field(foreign_key="teams.id")
    name: str = Field(sa_type=String(200))
    status: str = Field(default=JobStatus.queued, sa_type=String(16))
    spec: dict[str, Any] = Field(sa_type=JSON)
    created_at: datetime = timestamp()
    updated_at: datetime = timestamp()
    started_at: datetime | None = optional_timestamp()
    finished_at: datetime | None = optional_timestamp()
    steps_done: int = 0
    total_steps: int
    attempts: int = 0
    heartbeat_at: datetime | None = optional_timestamp()
    worker_id: str | None = Field(default=None, sa_type=String(200))
    requested_action: str | None = Field(default=None, sa_type=String(16))
    error_code: str | None = Field(default=None, sa_type=String(100))
    error_message: str | None = Field(default=None, sa_type=Text)
    final_weights_path: str | None = Field(default=None, sa_type=Text)
    last_state_path: str | None = Field(default=None, sa_type=Text)
    last_state_step: int | None = None
    queue_reason: str | None = Field(default=None, sa_type=Text)
    enqueue_count: int = 0
    idempotency_key: str | None = Field(default=None, sa_type=String(255))
    request_hash: str | None = Field(default=None, sa_type=String(64))
    metric_ends: dict[str, list[float | None]] = Field(default_factory=dict, sa_type=JSON)
    """The first and last point of the metrics a summary shows (kernel/summary.py), kept
    as steps are recorded so a job's summary costs no metric read."""
    priority: int = 0
    queued_at: datetime = timestamp()
    """When the job was submitted or resumed: fair dispatch serves the longest waiting."""
    sampled_tokens: int = Field(default=0, sa_type=BigInteger)
    teacher_tokens: int = Field(default=0, sa_type=BigInteger)
    trained_tokens: int = Field(default=0, sa_type=BigInteger)
    eval_tokens: int = Field(default=0, sa_type=BigInteger)
    sweep_id: int | None = Field(default=None, foreign_key="sweeps.id")
    sweep_trial: int | None = None
    """The job is trial `sweep_trial` of sweep `sweep_id` (unique per sweep)."""
    stop_reason: str | None = Field(default=None, sa_type=String(32))
    """Why the job was cancelled, when a machine decided it (`early_stopped`)."""
    progress: dict[str, Any] | None = Field(default=None, sa_type=JSON)
    """What the running job does now (kernel/progress.py), written with its heartbeat."""
    mlflow_run_id: str | None = Field(default=None, sa_type=String(64))
    """The MLflow run the job is mirrored into (trackers.mlflow), once a worker opened it."""

    @property
    def error(self) -> dict[str, str] | None:
        if self.error_code is None:
            return None
        return {"code": self.error_code, "message": self.error_message or ""}

    @property
    def summary(self) -> JobSummary:
        return summary_of_ends(self.metric_ends)

    @property
    def usage(self) -> JobUsage:
        return JobUsage(
            sampled_tokens=self.sampled_tokens,
            teacher_tokens=self.teacher_tokens,
            trained_tokens=self.trained_tokens,
            eval_tokens=self.eval_tokens,
        )


class Worker(SQLModel, table=True):
    """A worker process that runs jobs, and the slots it has: each worker notes itself as
    it starts and on every requeue pass, and leaves as it stops, so that a queued job can
    say how many slots the service has (app/jobs/places.py)."""

    __tablename__ = "workers"

    id: str = Field(primary_key=True, sa_type=String(200))
    """Its `worker_id` (host:pid), as jobs name it."""
    slots: int
    """Jobs it runs at once (OPD_WORKER_CONCURRENCY)."""
    seen_at: datetime = timestamp()


class Event(SQLModel, table=True):
    __tablename__ = "events"
    __table_args__ = (Index("ix_events_job_id_id", "job_id", "id"),)

    id: int | None = Field(default=None, primary_key=True)
    job_id: int = Field(foreign_key="jobs.id", ondelete="CASCADE")
    created_at: datetime = timestamp()
    level: str = Field(sa_type=String(16))
    message: str = Field(sa_type=Text)
    data: dict[str, Any] | None = Field(default=None, sa_type=JSON)


class MlflowEnding(SQLModel, table=True):
    """The outbox of MLflow runs to end: one row per job with `trackers.mlflow` that reached
    a terminal status, written in that transition's transaction (whoever made it: a
    worker, the API, a requeuer), so its run ends even when no worker mirrored the end.
    The workers send it, retrying from `next_attempt_at` while MLflow is away."""

    __tablename__ = "mlflow_endings"
    __table_args__ = (Index("ix_mlflow_endings_next_attempt_at", "next_attempt_at"),)

    job_id: int = Field(foreign_key="jobs.id", ondelete="CASCADE", primary_key=True)
    status: str = Field(sa_type=String(16))
    """The job's terminal status (succeeded, failed, cancelled)."""
    attempts: int = 0
    created_at: datetime = timestamp()
    next_attempt_at: datetime = timestamp()


class Checkpoint(SQLModel, table=True):
    __tablename__ = "checkpoints"
    __table_args__ = (
        Index("ix_checkpoints_job_id_id", "job_id", "id"),
        Index("ix_checkpoints_job_id_step", "job_id", "step"),
        Index("ix_checkpoints_path", "path"),
    )

    id: int | None = Field(default=None, primary_key=True)
    job_id: int = Field(foreign_key="jobs.id", ondelete="CASCADE")
    step: int
    kind: str = Field(sa_type=String(16))
    path: str = Field(sa_type=Text)
    created_at: datetime = timestamp()
