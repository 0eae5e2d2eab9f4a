"""OpenAI's fine-tuning bodies, as the `openai` package sends and reads them: a job to create
(its distillation settings, which OpenAI has no name for, as `method.distillation`), a
job, its events and checkpoints, and their lists."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field

from app.core.pages import ObjectList
from app.files.schemas import FILE_ID_PATTERN
from kernel.json_types import JsonModel
from kernel.spec.base import ModelName
from kernel.spec.job import Metadata

Auto = Literal["auto"]


class Strict(JsonModel):
    model_config = ConfigDict(extra="forbid")


class Hyperparameters(Strict):
    """OpenAI's hyperparameters, each `auto` (the job's default) or a value."""

    batch_size: Auto | Annotated[int, Field(ge=1)] | None = Field(
        None, description="Prompts a step (`loop.batch_size`); `auto`: the spec's default."
    )
    learning_rate_multiplier: Auto | Annotated[float, Field(gt=0, le=1e6)] | None = Field(
        None, description="Times the student's default learning rate (`optim.learning_rate`)."
    )
    n_epochs: Auto | Annotated[int, Field(ge=1, le=1000)] | None = Field(
        None,
        description="Passes over the training file's prompts: `loop.steps` is "
        "ceil(n_epochs x prompts / batch_size); `auto`: the spec's steps.",
    )


class Distillation(Strict):
    """This service's own: the job spec's fields (`teacher` or `teachers`, `backend`
    (default `local`), `loop` with its objective, `sampling`, `optim`, `eval`, `dataset`'s
    options such as `turns`, ...) beside OpenAI's `hyperparameters`. `model`,
    `training_file`, `validation_file`, `seed`, `suffix` and `metadata` fill the rest."""

    model_config = ConfigDict(extra="allow")

    hyperparameters: Hyperparameters | None = None


class Method(Strict):
    type: Literal["distillation", "supervised", "dpo", "reinforcement"] = Field(
        description="Only `distillation`: this service distils (on-policy) from a teacher."
    )
    distillation: Distillation | None = None
    supervised: dict[str, Any] | None = None
    dpo: dict[str, Any] | None = None
    reinforcement: dict[str, Any] | None = None


class FineTuningJobCreate(Strict):
    """`POST /v1/fine_tuning/jobs`, as `client.fine_tuning.jobs.create` sends it."""

    model: ModelName = Field(description="The student's base model (`student.base_model`).")
    training_file: str = Field(pattern=FILE_ID_PATTERN, description="An uploaded file, file-N.")
    validation_file: str | None = Field(
        None, pattern=FILE_ID_PATTERN, description="Held-out prompts for eval (`eval.dataset`)."
    )
    suffix: str | None = Field(
        None, min_length=1, max_length=64, description="The job's name (`name`)."
    )
    seed: int | None = Field(None, ge=0, le=2**31 - 1, description="The student's seed.")
    metadata: Metadata | None = None
    hyperparameters: Hyperparameters | None = Field(
        None, description="OpenAI's older place for them; or `method.distillation.hyperparameters`."
    )
    method: Method | None = Field(
        None,
        description="`{type: distillation, distillation: {teacher: ..., ...}}` (the `openai` "
        "package sends it as `method=` or in `extra_body`).",
    )
    integrations: list[Any] | None = Field(
        None, description="Only none: trackers are the spec's (`method.distillation.trackers`)."
    )


class FineTuningError(Strict):
    code: str
    message: str
    param: str | None = None


class FineTuningJob(Strict):
    """A job as OpenAI's `fine_tuning.job`: any job of the team, made here or elsewhere."""

    id: str = Field(description="`ftjob-N`: job N of the rest of the API, the CLI and the SDK.")
    object: Literal["fine_tuning.job"] = "fine_tuning.job"
    created_at: int
    finished_at: int | None
    model: str = Field(description="The student's base model.")
    fine_tuned_model: str | None = Field(
        description="`job-N` once it succeeded: a model of /v1/chat/completions at once."
    )
    organization_id: str = Field(description="The team's name.")
    status: Literal[
        "validating_files", "queued", "running", "paused", "succeeded", "failed", "cancelled"
    ] = Field(
        description="`running` while it runs, cancels or pauses; `paused` (this service's) "
        "once paused."
    )
    training_file: str | None = Field(description="The uploaded file it trains on, if any.")
    validation_file: str | None
    hyperparameters: dict[str, Any]
    trained_tokens: int | None = Field(description="Tokens trained on, once it ended.")
    error: FineTuningError | None
    seed: int
    result_files: list[str] = Field(default_factory=list)
    estimated_finish: int | None = None
    integrations: list[Any] = Field(default_factory=list)
    metadata: dict[str, str] | None = None
    method: dict[str, Any]


class FineTuningJobs(ObjectList[FineTuningJob]):
    """Newest first."""


class FineTuningEvent(Strict):
    id: str = Field(description="`ftevent-N`.")
    object: Literal["fine_tuning.job.event"] = "fine_tuning.job.event"
    created_at: int
    level: Literal["info", "warn", "error"]
    message: str
    data: dict[str, Any] | None = None
    type: Literal["message", "metrics"] = "message"


class FineTuningEvents(ObjectList[FineTuningEvent]):
    """Newest first."""


class CheckpointMetrics(Strict):
    model_config = ConfigDict(extra="allow")

    step: int


class FineTuningCheckpoint(Strict):
    id: str = Field(description="`ftckpt-N`.")
    object: Literal["fine_tuning.job.checkpoint"] = "fine_tuning.job.checkpoint"
    created_at: int
    fine_tuned_model_checkpoint: str = Field(
        description="`job-N@step-S` (`job-N` for the final weights): a model of "
        "/v1/chat/completions."
    )
    fine_tuning_job_id: str
    step_number: int
    metrics: CheckpointMetrics = Field(
        description="`step`, and the step's figures under this service's names (e.g. "
        "`opd/reverse_kl_mean`) where recorded."
    )


class FineTuningCheckpoints(ObjectList[FineTuningCheckpoint]):
    """Newest first."""
