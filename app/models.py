"""Database tables (SQLModel) and, beside each, the public schema the API returns.

Teams own API keys and jobs; a job owns its step metrics, checkpoints and events.
Status and kind columns are plain strings (not database enums) so that adding a
value never needs a Postgres type migration.
"""

import math
from datetime import UTC, date, datetime
from enum import StrEnum
from typing import Annotated, Any, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, StringConstraints, model_validator
from sqlalchemy import (
    JSON,
    BigInteger,
    DateTime,
    Index,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
)
from sqlmodel import Field, SQLModel

from app.outbound import URL_PATTERN
from kernel.spec import JobSpec
from kernel.summary import JobSummary, summary_of_ends

T = TypeVar("T")

# Deterministic constraint names, so later migrations can alter them on SQLite and Postgres.
SQLModel.metadata.naming_convention = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def utcnow() -> datetime:
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC in Python on every database (SQLite stores naive UTC)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetimes are ambiguous; pass an aware UTC datetime")
        value = value.astimezone(UTC)
        return value if dialect.name == "postgresql" else value.replace(tzinfo=None)

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def timestamp() -> Any:
    return Field(default_factory=utcnow, sa_type=UTCDateTime)


def optional_timestamp() -> Any:
    return Field(default=None, sa_type=UTCDateTime)


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


class CheckpointKind(StrEnum):
    state = "state"
    sampler = "sampler"
    final = "final"


class EventLevel(StrEnum):
    debug = "debug"
    info = "info"
    warning = "warning"
    error = "error"


def finite_or_none(value: float) -> float | None:
    """JSON (and Postgres) has no NaN or infinity: a non-finite metric is stored as null."""
    value = float(value)
    return value if math.isfinite(value) else None


# --- teams and keys -------------------------------------------------------------------------


class Team(SQLModel, table=True):
    """A team; its limits override the service-wide defaults (None = the default)."""

    __tablename__ = "teams"

    id: int | None = Field(default=None, primary_key=True)
    name: str = Field(sa_type=String(200), unique=True)
    created_at: datetime = timestamp()
    max_running: int | None = None
    max_queued: int | None = None


class Scope(StrEnum):
    """What a key may do, each including the one before: `read` (GET only), `submit` (create
    and act on its team's jobs and webhooks), `admin` (every team, keys, teams' limits)."""

    read = "read"
    submit = "submit"
    admin = "admin"

    def allows(self, needed: "Scope") -> bool:
        order = list(Scope)
        return order.index(self) >= order.index(needed)


class ApiKey(SQLModel, table=True):
    """Only the key's SHA-256 is stored; `prefix` names the key in listings and logs."""

    __tablename__ = "api_keys"

    id: int | None = Field(default=None, primary_key=True)
    team_id: int = Field(foreign_key="teams.id", index=True)
    prefix: str = Field(sa_type=String(32), unique=True)
    key_hash: str = Field(sa_type=String(64), unique=True)
    scope: str = Field(default=Scope.submit, sa_type=String(16))
    created_at: datetime = timestamp()
    revoked_at: datetime | None = optional_timestamp()
    expires_at: datetime | None = optional_timestamp()


MAX_KEY_DAYS = 3660


class KeyPublic(BaseModel):
    prefix: str = Field(description="Names the key; the secret is never stored or shown.")
    team: str
    scope: Scope
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None


class KeysList(BaseModel):
    data: list[KeyPublic]


class KeyCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    team: str = Field(min_length=1, max_length=200, description="Created if new.")
    scope: Scope = Scope.submit
    expires_in_days: int | None = Field(None, ge=1, le=MAX_KEY_DAYS, description="null: never.")


class KeyCreated(KeyPublic):
    key: str = Field(description="The key itself, shown only in this answer.")


class TeamPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    name: str
    max_running: int | None = Field(description="The team's own limit; null: the default.")
    max_queued: int | None = Field(description="The team's own limit; null: the default.")
    effective_max_running: int | None = Field(description="The limit in force; null: none.")
    effective_max_queued: int | None = Field(description="The limit in force; null: none.")
    running: int = Field(description="Jobs running (or stopping) now.")
    queued: int = Field(description="Jobs queued now.")


class TeamsList(BaseModel):
    data: list[TeamPublic]


class LimitsUpdate(BaseModel):
    """Only the fields sent change; null puts a limit back to the service's default."""

    model_config = ConfigDict(extra="forbid")

    max_running: int | None = Field(None, ge=1, le=100_000)
    max_queued: int | None = Field(None, ge=1, le=1_000_000)


# --- jobs -----------------------------------------------------------------------------------


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


class Job(SQLModel, table=True):
    __tablename__ = "jobs"
    __table_args__ = (
        UniqueConstraint("team_id", "idempotency_key", name="uq_jobs_team_idempotency_key"),
        UniqueConstraint("sweep_id", "sweep_trial", name="uq_jobs_sweep_id_sweep_trial"),
        Index("ix_jobs_team_id_id", "team_id", "id"),
        Index("ix_jobs_team_id_status_id", "team_id", "status", "id"),
        Index("ix_jobs_status", "status"),
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


class JobError(BaseModel):
    code: str
    message: str


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
    queue_reason: str | None = Field(description="Why a queued job is still waiting, if known.")
    priority: int = Field(description="Orders the job among its own team's queued jobs only.")
    mlflow_run_id: str | None = Field(
        None, description="The MLflow run it is mirrored into (trackers.mlflow), once opened."
    )
    usage: JobUsage
    sweep_id: int | None = Field(None, description="The sweep this job is a trial of.")
    sweep_trial: int | None = Field(None, description="Its trial number in that sweep.")
    stop_reason: str | None = Field(
        None, description="`early_stopped`: its sweep cancelled it (its state is kept)."
    )
    summary: JobSummary = Field(
        description="Reverse KL first and last; held-out eval accuracy and KL before and "
        "after; the teacher's baseline (each present once recorded)."
    )


class Page(BaseModel, Generic[T]):
    data: list[T]
    next_cursor: int | None = None


class JobsPage(Page[JobPublic]):
    """Newest first; pass `next_cursor` as `after` to get the next page."""


# --- what a job records -----------------------------------------------------------------------


class StepMetric(SQLModel, table=True):
    """All metrics of one step; written by upsert so a replayed step overwrites its row."""

    __tablename__ = "step_metrics"

    job_id: int = Field(foreign_key="jobs.id", ondelete="CASCADE", primary_key=True)
    step: int = Field(primary_key=True)
    metrics: dict[str, float | None] = Field(sa_type=JSON)
    recorded_at: datetime = timestamp()


class MetricSummary(SQLModel, table=True):
    """One metric over one complete block of `width` steps (app/summaries.py): what charts
    read, so a curve costs the same whatever the job's length."""

    __tablename__ = "metric_summaries"
    __table_args__ = (
        Index("ix_metric_summaries_job_id_width_block", "job_id", "width", "block"),
        {"sqlite_with_rowid": False},
    )

    job_id: int = Field(foreign_key="jobs.id", ondelete="CASCADE", primary_key=True)
    key: str = Field(sa_type=Text, primary_key=True)
    width: int = Field(primary_key=True)
    block: int = Field(primary_key=True)
    points: int
    first_step: int
    first_value: float | None
    last_step: int
    last_value: float | None
    min_step: int | None
    min_value: float | None
    max_step: int | None
    max_value: float | None


class MetricCurve(BaseModel):
    steps: list[int]
    values: list[float | None]


class Downsampling(BaseModel):
    """How the curves were cut down to `max_points`."""

    method: Literal["none", "minmax"] = Field(
        description="`none`: every recorded point. `minmax`: each bucket's min and max point "
        "in step order, plus the range's first and last point."
    )
    first_step: int | None = Field(description="The first recorded step in the range.")
    last_step: int | None = Field(description="The last recorded step in the range.")
    buckets: int | None = Field(description="Buckets the range was cut into (minmax).")
    bucket_steps: int | None = Field(
        description="Steps per bucket, about: buckets follow stored block boundaries."
    )


class MetricsPublic(BaseModel):
    """Curves by metric name: exact when short, else each bucket's min and max (spikes are
    kept); the first and last points are always kept. Null values are non-finite ones."""

    job_id: int
    curves: dict[str, MetricCurve]
    downsampling: Downsampling


class JobsMetricsPublic(BaseModel):
    """Curves of several jobs, in the order asked for."""

    jobs: list[MetricsPublic]


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


class CheckpointPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    step: int
    kind: CheckpointKind
    path: str
    created_at: datetime


class CheckpointsPage(Page[CheckpointPublic]):
    """Oldest first; pass `next_cursor` as `after` to get the next page."""


class Event(SQLModel, table=True):
    __tablename__ = "events"
    __table_args__ = (Index("ix_events_job_id_id", "job_id", "id"),)

    id: int | None = Field(default=None, primary_key=True)
    job_id: int = Field(foreign_key="jobs.id", ondelete="CASCADE")
    created_at: datetime = timestamp()
    level: str = Field(sa_type=String(16))
    message: str = Field(sa_type=Text)
    data: dict[str, Any] | None = Field(default=None, sa_type=JSON)


class EventPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    created_at: datetime
    level: EventLevel
    message: str
    data: dict[str, Any] | None


class EventsPage(Page[EventPublic]):
    """Oldest first; pass `next_cursor` as `after` to get the next page."""


class Sample(SQLModel, table=True):
    """One rollout a job kept: what the student wrote and how far each token was from the
    teacher. Upserted on (job_id, step, position), so a replayed step overwrites."""

    __tablename__ = "samples"
    __table_args__ = (
        UniqueConstraint("job_id", "step", "position", name="uq_samples_job_id_step_position"),
    )

    id: int | None = Field(default=None, primary_key=True)
    job_id: int = Field(foreign_key="jobs.id", ondelete="CASCADE")
    step: int
    position: int
    prompt: str = Field(sa_type=Text)
    completion: str = Field(sa_type=Text)
    tokens: list[str] = Field(sa_type=JSON)
    reverse_kl: list[float | None] = Field(sa_type=JSON)
    truncated: bool = False
    created_at: datetime = timestamp()


class SamplePublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    step: int = Field(description="The training step that sampled it.")
    position: int = Field(description="Its place among the step's kept rollouts.")
    prompt: str = Field(description="The question, before the chat template.")
    completion: str
    tokens: list[str] = Field(description="The completion's tokens, decoded one by one.")
    reverse_kl: list[float | None] = Field(
        description="student - teacher logprob of each token (null: not finite)."
    )
    truncated: bool = Field(description="Cut to the stored length (the tokens' tail is gone).")
    created_at: datetime


class SamplesPage(Page[SamplePublic]):
    """Oldest step first; pass `next_cursor` as `after` to get the next page."""


# --- sharing the service: usage, audit, webhooks ---------------------------------------------


class UsageDay(SQLModel, table=True):
    """One job's tokens on one UTC day: what `GET /v1/usage` adds up. A replayed step moves
    its count (old values out, new in) on the day it is replayed."""

    __tablename__ = "usage_days"
    __table_args__ = (Index("ix_usage_days_team_id_day", "team_id", "day"),)

    job_id: int = Field(foreign_key="jobs.id", ondelete="CASCADE", primary_key=True)
    day: date = Field(primary_key=True)
    team_id: int = Field(foreign_key="teams.id")
    sampled_tokens: int = Field(default=0, sa_type=BigInteger)
    teacher_tokens: int = Field(default=0, sa_type=BigInteger)
    trained_tokens: int = Field(default=0, sa_type=BigInteger)
    eval_tokens: int = Field(default=0, sa_type=BigInteger)


class Replay(SQLModel, table=True):
    """A request sent with an Idempotency-Key whose work no job row keeps (a playground
    sample, a chat completion): made before the work, its `answer` kept once there is one,
    so a repeat until `expires_at` is answered with it instead of being done again."""

    __tablename__ = "replays"
    __table_args__ = (
        UniqueConstraint("team_id", "idempotency_key", name="uq_replays_team_id_idempotency_key"),
        Index("ix_replays_expires_at", "expires_at"),
    )

    id: int | None = Field(default=None, primary_key=True)
    team_id: int = Field(foreign_key="teams.id")
    idempotency_key: str = Field(sa_type=String(255))
    request_hash: str = Field(sa_type=String(64))
    task_id: str = Field(sa_type=String(64))
    """The worker task its work is sent as: a repeat joins it (or finds its answer)."""
    answer: str | None = Field(default=None, sa_type=Text)
    created_at: datetime = timestamp()
    expires_at: datetime = timestamp()


class MlflowEnding(SQLModel, table=True):
    """The outbox of MLflow runs to end: one row per job with `trackers.mlflow` that reached
    a terminal status, written in that transition's transaction (whoever made it: a
    worker, the API, a sweeper), so its run ends even when no worker mirrored the end.
    The workers send it, retrying from `next_attempt_at` while MLflow is away."""

    __tablename__ = "mlflow_endings"
    __table_args__ = (Index("ix_mlflow_endings_next_attempt_at", "next_attempt_at"),)

    job_id: int = Field(foreign_key="jobs.id", ondelete="CASCADE", primary_key=True)
    status: str = Field(sa_type=String(16))
    """The job's terminal status (succeeded, failed, cancelled)."""
    attempts: int = 0
    created_at: datetime = timestamp()
    next_attempt_at: datetime = timestamp()


class AuditEntry(SQLModel, table=True):
    """One state-changing request: who (key prefix and team), what, on what, and how it went."""

    __tablename__ = "audit_log"
    __table_args__ = (Index("ix_audit_log_team_id_id", "team_id", "id"),)

    id: int | None = Field(default=None, primary_key=True)
    created_at: datetime = timestamp()
    key_prefix: str | None = Field(default=None, sa_type=String(32))
    team_id: int | None = Field(default=None, foreign_key="teams.id")
    action: str = Field(sa_type=String(64))
    target: str | None = Field(default=None, sa_type=Text)
    status_code: int
    detail: dict[str, Any] | None = Field(default=None, sa_type=JSON)


class AuditEntryPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    created_at: datetime
    key_prefix: str | None = Field(description="The key's public prefix; null: the command line.")
    team_id: int | None = Field(description="The key's team.")
    action: str = Field(description="e.g. `job.submit`, `job.cancel`, `webhook.create`.")
    target: str | None = Field(description="What it acted on, e.g. `job 12`.")
    status_code: int = Field(description="The HTTP status the request was answered with.")
    detail: dict[str, Any] | None


class AuditPage(Page[AuditEntryPublic]):
    """Newest first; pass `next_cursor` as `after` to get the next page."""


class WebhookEvent(StrEnum):
    succeeded = "job.succeeded"
    failed = "job.failed"
    cancelled = "job.cancelled"
    paused = "job.paused"
    eval_completed = "job.eval_completed"
    sweep_completed = "sweep.completed"


class DeliveryStatus(StrEnum):
    pending = "pending"
    delivered = "delivered"
    failed = "failed"


class Webhook(SQLModel, table=True):
    """A team's subscription. The secret signs deliveries, so it is kept (shown once),
    encrypted (app/core/encryption.py)."""

    __tablename__ = "webhooks"
    __table_args__ = (Index("ix_webhooks_team_id", "team_id"),)

    id: int | None = Field(default=None, primary_key=True)
    team_id: int = Field(foreign_key="teams.id")
    url: str = Field(sa_type=Text)
    events: list[str] = Field(sa_type=JSON)
    description: str | None = Field(default=None, sa_type=Text)
    secret: str = Field(sa_type=Text)
    created_at: datetime = timestamp()
    deleted_at: datetime | None = optional_timestamp()


class WebhookDelivery(SQLModel, table=True):
    """The outbox: one event for one webhook, written in the transaction of the job's change
    and sent by the workers until it is delivered or its retry window ends."""

    __tablename__ = "webhook_deliveries"
    __table_args__ = (
        Index("ix_webhook_deliveries_status_next_attempt_at", "status", "next_attempt_at"),
        Index("ix_webhook_deliveries_webhook_id_id", "webhook_id", "id"),
    )

    id: int | None = Field(default=None, primary_key=True)
    webhook_id: int = Field(foreign_key="webhooks.id", ondelete="CASCADE")
    job_id: int | None = Field(default=None, foreign_key="jobs.id", ondelete="CASCADE")
    event: str = Field(sa_type=String(32))
    message_id: str = Field(sa_type=String(64), unique=True)
    payload: dict[str, Any] = Field(sa_type=JSON)
    status: str = Field(default=DeliveryStatus.pending, sa_type=String(16))
    attempts: int = 0
    created_at: datetime = timestamp()
    next_attempt_at: datetime = timestamp()
    retry_until: datetime = timestamp()
    lease_until: datetime | None = optional_timestamp()
    delivered_at: datetime | None = optional_timestamp()
    last_status_code: int | None = None
    last_error: str | None = Field(default=None, sa_type=Text)


class WebhookAttempt(SQLModel, table=True):
    """One try at sending a delivery, as it went."""

    __tablename__ = "webhook_attempts"
    __table_args__ = (Index("ix_webhook_attempts_delivery_id_id", "delivery_id", "id"),)

    id: int | None = Field(default=None, primary_key=True)
    delivery_id: int = Field(foreign_key="webhook_deliveries.id", ondelete="CASCADE")
    attempted_at: datetime = timestamp()
    worker_id: str = Field(sa_type=String(200))
    status_code: int | None = None
    error: str | None = Field(default=None, sa_type=Text)
    duration_ms: float


class WebhookCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    url: str = Field(
        min_length=8,
        max_length=2000,
        schema_extra={"json_schema_extra": {"pattern": URL_PATTERN}},
        description="http(s) URL that receives the events: a host (not a private address "
        "unless OPD_WEBHOOK_ALLOW_PRIVATE), an optional port, no credentials.",
    )
    events: list[WebhookEvent] = Field(min_length=1, max_length=len(WebhookEvent))
    description: str | None = Field(None, max_length=500)


class WebhookPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    team_id: int
    url: str
    events: list[WebhookEvent]
    description: str | None
    created_at: datetime


class WebhookCreated(WebhookPublic):
    secret: str = Field(
        description="The signing secret (`whsec_...`), shown only in this answer: keep it."
    )


class WebhooksPage(Page[WebhookPublic]):
    """Oldest first."""


class AttemptPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    attempted_at: datetime
    status_code: int | None = Field(description="The receiver's answer; null: none came.")
    error: str | None
    duration_ms: float


class DeliveryPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    job_id: int | None
    event: WebhookEvent
    message_id: str = Field(description="The `webhook-id` header: the same on every attempt.")
    status: DeliveryStatus
    attempts: int
    created_at: datetime
    next_attempt_at: datetime
    retry_until: datetime = Field(description="Failed attempts are retried until then.")
    delivered_at: datetime | None
    last_status_code: int | None
    last_error: str | None
    payload: dict[str, Any]


class DeliveriesPage(Page[DeliveryPublic]):
    """Newest first; pass `next_cursor` as `after` to get the next page."""


class DeliveryDetail(DeliveryPublic):
    attempt_log: list[AttemptPublic] = Field(description="Every attempt, oldest first.")


# --- sweeps ---------------------------------------------------------------------------------

MAX_TRIALS = 200
MAX_PARAMETERS = 16
MAX_VALUES = 100
ParameterValue = bool | int | float | str
SweepName = Annotated[
    str, StringConstraints(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
]
DottedPath = Annotated[
    str, StringConstraints(min_length=1, max_length=200, pattern=r"^[a-z_]+(\.[a-z_0-9]+)+$")
]


class SweepStatus(StrEnum):
    running = "running"
    completed = "completed"
    cancelled = "cancelled"
    failed = "failed"


class SweepMethod(StrEnum):
    grid = "grid"
    random = "random"
    tpe = "tpe"


class Parameter(BaseModel):
    """One dimension of the search: a list of `values`, or a range (`min`, `max`) drawn
    from a distribution (random and tpe only). Numbers are finite (JSON has no others)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    values: list[ParameterValue] | None = Field(None, min_length=1, max_length=MAX_VALUES)
    min: float | None = None
    max: float | None = None
    distribution: Literal["uniform", "log_uniform", "int_uniform"] = "uniform"

    @model_validator(mode="after")
    def _values_or_range(self) -> "Parameter":
        if (self.values is None) == (self.min is None or self.max is None):
            raise ValueError("give either values: [...] or both min and max")
        if self.values is not None:
            if self.min is not None or self.max is not None:
                raise ValueError("give either values: [...] or min and max, not both")
            return self
        assert self.min is not None and self.max is not None
        if self.min >= self.max:
            raise ValueError("min must be below max")
        if self.distribution == "log_uniform" and self.min <= 0:
            raise ValueError("a log_uniform range needs min > 0")
        if self.distribution == "int_uniform" and not (
            self.min.is_integer() and self.max.is_integer()
        ):
            raise ValueError("an int_uniform range needs whole min and max")
        return self


class SweepMetric(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=200, description="Any step metric's name.")
    goal: Literal["minimize", "maximize"]


class EarlyStop(BaseModel):
    """Stop a running trial whose metric at a rung is among the losers at that step:
    `asha` keeps the best 1/eta of the trials at rungs min_steps * eta^k; `median` stops a
    trial worse than the median of the others at every multiple of min_steps."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["asha", "median"]
    min_steps: int = Field(ge=1, le=100_000)
    eta: int = Field(3, ge=2, le=100, description="ASHA's reduction factor.")


class SweepCreate(BaseModel):
    """A search over a job spec: trials are jobs whose spec is `base` (or `base_job`'s
    spec) with each parameter's value at its dotted path."""

    model_config = ConfigDict(extra="forbid")

    name: SweepName
    base: dict[str, Any] | None = Field(None, description="A job spec.")
    base_job: int | None = Field(None, ge=1, le=2**31 - 1, description="Or that job's spec.")
    parameters: dict[DottedPath, Parameter] = Field(
        min_length=1,
        max_length=MAX_PARAMETERS,
        schema_extra={"json_schema_extra": {"additionalProperties": False}},  # dotted paths only
    )
    method: SweepMethod = SweepMethod.random
    metric: SweepMetric
    max_trials: int = Field(10, ge=1, le=MAX_TRIALS)
    parallel: int = Field(1, ge=1, le=64, description="Trials queued or running at once.")
    seed: int = Field(0, ge=0, le=2**31 - 1)
    early_stop: EarlyStop | None = None

    @model_validator(mode="after")
    def _one_base(self) -> "SweepCreate":
        if (self.base is None) == (self.base_job is None):
            raise ValueError("give either base (a job spec) or base_job (a job id)")
        if self.method is SweepMethod.grid:
            ranged = [path for path, p in self.parameters.items() if p.values is None]
            if ranged:
                raise ValueError(f"a grid needs values for every parameter: {ranged[0]} has none")
        return self


class Sweep(SQLModel, table=True):
    """A search; its trials are the jobs that name it (`Job.sweep_id`). The controller
    that advances it holds `lease_owner` until `lease_until`."""

    __tablename__ = "sweeps"
    __table_args__ = (
        Index("ix_sweeps_team_id_id", "team_id", "id"),
        Index("ix_sweeps_status", "status"),
    )

    id: int | None = Field(default=None, primary_key=True)
    team_id: int = Field(foreign_key="teams.id")
    name: str = Field(sa_type=String(100))
    status: str = Field(default=SweepStatus.running, sa_type=String(16))
    definition: dict[str, Any] = Field(sa_type=JSON)
    """The SweepCreate as submitted, `base` the validated spec (`base_job`'s if given)."""
    base_job_id: int | None = None
    """The job whose spec `base` is, if the sweep started from one (no foreign key: a
    job names its sweep, and the two tables should not point at each other)."""
    created_at: datetime = timestamp()
    updated_at: datetime = timestamp()
    finished_at: datetime | None = optional_timestamp()
    error_message: str | None = Field(default=None, sa_type=Text)
    lease_owner: str | None = Field(default=None, sa_type=String(200))
    lease_until: datetime | None = optional_timestamp()


class SweepRung(SQLModel, table=True):
    """The controller's judgment of a trial at one rung of its sweep's early stopping
    (app/early_stopping.py): made once, when the trial is first found there, and never
    revisited, so a restarted controller decides as the first did."""

    __tablename__ = "sweep_rungs"
    __table_args__ = (Index("ix_sweep_rungs_sweep_id_rung", "sweep_id", "rung"),)

    job_id: int = Field(foreign_key="jobs.id", ondelete="CASCADE", primary_key=True)
    rung: int = Field(primary_key=True)
    sweep_id: int = Field(foreign_key="sweeps.id", ondelete="CASCADE")
    value: float | None = None
    """The metric's last point at or before the rung (None: not finite, or none)."""
    kept: bool
    competing: int
    """Trials at the rung it was judged against, itself included."""
    decided_at: datetime = timestamp()


class RungPublic(BaseModel):
    step: int = Field(description="The rung.")
    value: float | None = Field(description="The metric there: its last point by that step.")
    kept: bool = Field(description="Whether the trial continued past the rung.")
    competing: int = Field(description="Trials it was judged against there, itself included.")


class TrialPublic(BaseModel):
    number: int
    job_id: int
    status: JobStatus
    values: dict[str, ParameterValue | None] = Field(description="The trial's parameters.")
    metric: float | None = Field(description="The metric's last recorded value.")
    metric_step: int | None = Field(description="The step it was recorded at.")
    best_so_far: float | None = Field(description="The best metric of trials 1..number.")
    steps_done: int
    total_steps: int
    stop_reason: str | None
    judged: RungPublic | None = Field(
        None, description="The last rung early stopping judged it at (once per rung)."
    )


class SweepPublic(BaseModel):
    id: int
    team_id: int
    name: str
    status: SweepStatus
    method: SweepMethod
    metric: SweepMetric
    parameters: dict[str, Parameter]
    max_trials: int
    parallel: int
    seed: int
    early_stop: EarlyStop | None
    base_job: int | None
    base: dict[str, Any] = Field(description="The spec every trial starts from.")
    created_at: datetime
    finished_at: datetime | None
    error: str | None
    trials_planned: int = Field(description="Trials the sweep runs: max_trials, or the grid.")
    trials_created: int
    best: TrialPublic | None = Field(description="The trial with the best metric so far.")
    steps_saved: int = Field(description="Steps early-stopped trials did not run.")


class SweepDetail(SweepPublic):
    trials: list[TrialPublic] = Field(description="By trial number.")


class SweepsPage(Page[SweepPublic]):
    """Newest first; pass `next_cursor` as `after` to get the next page."""
