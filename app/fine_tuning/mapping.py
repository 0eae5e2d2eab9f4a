"""OpenAI's fine-tuning jobs as this service's jobs, and back (pure): the spec a create
request makes (OpenAI's fields onto the spec's, `method.distillation` the spec's own,
`hyperparameters` onto the loop and the optimiser), a spec's fields named as the request
names them, and a job, its events and its checkpoints in OpenAI's shapes.

Ids: job N is `ftjob-N`, its event N `ftevent-N`, its checkpoint N `ftckpt-N`; its final
weights are the model `job-N`, those saved after step S `job-N@step-S`, as the chat doors
name them.
"""

from __future__ import annotations

import math
import re
from typing import Any

from app.fine_tuning.schemas import (
    CheckpointMetrics,
    FineTuningCheckpoint,
    FineTuningError,
    FineTuningEvent,
    FineTuningJob,
    FineTuningJobCreate,
    Hyperparameters,
)
from app.jobs.errors import SpecRefused
from app.jobs.schemas import CheckpointKind, CheckpointPublic, EventPublic, JobPublic, JobStatus
from kernel.spec import FileDataset, JobSpec
from kernel.spec.loop import LoopSpec

JOB, EVENT, CHECKPOINT = "ftjob-", "ftevent-", "ftckpt-"
STATUSES = {
    JobStatus.queued: "queued",
    JobStatus.running: "running",
    JobStatus.cancelling: "running",
    JobStatus.pausing: "running",
    JobStatus.paused: "paused",
    JobStatus.succeeded: "succeeded",
    JobStatus.failed: "failed",
    JobStatus.cancelled: "cancelled",
}
LEVELS = {"debug": "info", "info": "info", "warning": "warn", "error": "error"}
OPENAI_NAMES = {
    ("student", "base_model"): ("model",),
    ("student", "seed"): ("seed",),
    ("dataset", "file"): ("training_file",),
    ("eval", "dataset", "file"): ("validation_file",),
    ("name",): ("suffix",),
    ("metadata",): ("metadata",),
}
"""The spec's fields a create request fills from OpenAI's (the rest are the method's)."""
DISTILLATION = ("method", "distillation")
DISTILS = (
    "this service distils: its jobs train a student on-policy against a teacher's logprobs "
    "(no supervised targets, preferences or grader). Send method {type: distillation, "
    "distillation: {teacher: {base_model: ...}}} (the openai package: method=... or "
    "extra_body); its other fields are the job spec's, and loop.cold_start {steps: N, "
    "source: reference} first trains on the file's own answers "
    "(docs/how-to/openai-clients.md, Fine-tuning jobs)"
)
CHECKPOINT_METRICS = ("opd/reverse_kl_mean", "eval/accuracy", "eval/reverse_kl_mean")
"""A checkpoint's figures (of the step that made its weights), by the service's names."""
NAME_CHARACTERS = re.compile(r"[^A-Za-z0-9._-]+")


def public_number(public: str, prefix: str) -> int | None:
    """`ftjob-12` -> 12; None for an id that is not one of this prefix's."""
    if not public.startswith(prefix) or not public[len(prefix) :].isdigit():
        return None
    number = int(public[len(prefix) :])
    return number if 0 < number < 2**31 else None


def openai_loc(loc: tuple[Any, ...]) -> tuple[Any, ...]:
    """A spec field's location as the create request names it."""
    for spec_loc, named in OPENAI_NAMES.items():
        if tuple(loc[: len(spec_loc)]) == spec_loc:
            return (*named, *loc[len(spec_loc) :])
    return (*DISTILLATION, *loc)


def openai_param(param: str) -> str:
    """A spec field's dotted name as the create request names it."""
    parts = tuple(int(part) if part.isdigit() else part for part in param.split("."))
    return ".".join(str(part) for part in openai_loc(parts))


def given_twice(field: str, instead: str) -> SpecRefused:
    return SpecRefused(".".join((*DISTILLATION, field)), f"is `{instead}`'s to say; leave it out")


def prompt_count(report: dict[str, Any], dataset: dict[str, Any]) -> int:
    """The prompts a file gives a job (its report's count, by the dataset's `turns` for
    conversations), of the `sample_size` it keeps."""
    chat = report.get("chat")
    usable = report["rows"] - report.get("empty_questions", 0)
    prompts = usable
    if chat is not None:
        prompts = chat["prompts_each" if dataset.get("turns") == "each" else "prompts_last"]
    kept = dataset.get("sample_size")
    if kept is None or not usable:
        return prompts
    return max(1, round(prompts * min(1.0, kept / usable)))


def hyperparameters_of(create: FineTuningJobCreate) -> Hyperparameters:
    method = create.method
    inner = method.distillation.hyperparameters if method and method.distillation else None
    if create.hyperparameters is not None and inner is not None:
        raise SpecRefused(
            "hyperparameters", "give hyperparameters once: here or in method.distillation"
        )
    return create.hyperparameters or inner or Hyperparameters()


def spec_document(create: FineTuningJobCreate, report: dict[str, Any] | None) -> dict[str, Any]:
    """The job spec a create request asks for, before validation: the method's fields,
    OpenAI's onto theirs (each given once), `batch_size` and `n_epochs` onto the loop
    (`report`: the training file's, whose prompts the epochs count). SpecRefused naming
    the request's field."""
    method = create.method
    if method is None or method.type != "distillation" or method.distillation is None:
        where = "method.type" if method is not None and method.type != "distillation" else "method"
        raise SpecRefused(where, DISTILS)
    if create.integrations:
        raise SpecRefused(
            "integrations", "none are taken here: trackers are method.distillation.trackers"
        )
    document = dict(method.distillation.model_extra or {})
    for field in ("datasets", "name", "metadata"):
        if field in document:
            raise given_twice(
                field, {"datasets": "training_file", "name": "suffix"}.get(field, field)
            )
    student = dict(document.get("student") or {})
    dataset = dict(document.get("dataset") or {})
    for given, field, instead in (
        (student, "base_model", "model"),
        (dataset, "file", "training_file"),
        (dataset, "path", "training_file"),
        (dataset, "source", "training_file"),
    ):
        if field in given:
            raise given_twice(f"{'student' if given is student else 'dataset'}.{field}", instead)
    student["base_model"] = create.model
    if create.seed is not None:
        student["seed"] = create.seed
    document |= {
        "backend": document.get("backend", "local"),
        "name": create.suffix or f"ft-{NAME_CHARACTERS.sub('-', create.model)[:180]}",
        "student": student,
        "dataset": {"source": "file", "file": create.training_file, **dataset},
        "metadata": create.metadata or {},
    }
    if create.validation_file is not None:
        evaluation = dict(document.get("eval") or {})
        if "dataset" in evaluation or "holdout" in evaluation:
            raise given_twice("eval.dataset", "validation_file")
        document["eval"] = evaluation | {
            "dataset": {"source": "file", "file": create.validation_file}
        }
    return with_hyperparameters(document, hyperparameters_of(create), report)


def with_hyperparameters(
    document: dict[str, Any], given: Hyperparameters, report: dict[str, Any] | None
) -> dict[str, Any]:
    """The document with OpenAI's batch size and epochs as the loop's batch size and steps
    (a field of the loop given too is refused: one says it)."""
    loop = dict(document.get("loop") or {})
    for name, field in (("batch_size", "batch_size"), ("n_epochs", "steps")):
        if isinstance(getattr(given, name), int) and field in loop:
            raise given_twice(f"loop.{field}", f"hyperparameters.{name}")
    if isinstance(given.batch_size, int):
        loop["batch_size"] = given.batch_size
    if isinstance(given.n_epochs, int) and report is not None:
        batch = loop.get("batch_size", LoopSpec.model_fields["batch_size"].default)
        prompts = prompt_count(report, document["dataset"])
        loop["steps"] = max(1, math.ceil(given.n_epochs * prompts / max(1, int(batch))))
    return document | ({"loop": loop} if loop else {})


def with_learning_rate(
    document: dict[str, Any], spec: JobSpec, given: Hyperparameters
) -> dict[str, Any] | None:
    """The document of `spec` with its learning rate times OpenAI's multiplier; None
    without one."""
    if not isinstance(given.learning_rate_multiplier, float | int):
        return None
    rate = spec.optim.learning_rate * given.learning_rate_multiplier
    return document | {"optim": {**document.get("optim", {}), "learning_rate": rate}}


def training_file(spec: JobSpec) -> str | None:
    """The uploaded file a job trains on (its first dataset's, with several)."""
    return next(
        (d.file for d in spec.dataset_shares() if isinstance(d, FileDataset) and d.file), None
    )


def validation_file(spec: JobSpec) -> str | None:
    dataset = spec.eval.dataset if spec.eval is not None else None
    return dataset.file if isinstance(dataset, FileDataset) else None


def job_hyperparameters(spec: JobSpec, prompts: int | None) -> dict[str, Any]:
    """What the job trains with, in OpenAI's words: its batch size, its learning rate over
    its student's default, and the passes its steps make over its file's prompts (`auto`
    where it trains on no uploaded file)."""
    epochs: float | str = "auto"
    if prompts:
        epochs = round(spec.loop.steps * spec.loop.batch_size / prompts, 2)
    return {
        "batch_size": spec.loop.batch_size,
        "learning_rate_multiplier": round(
            spec.optim.learning_rate / spec.default_learning_rate(), 6
        ),
        "n_epochs": epochs,
    }


def seconds(moment: Any) -> int | None:
    return None if moment is None else int(moment.timestamp())


def as_job(body: JobPublic, organization: str, prompts: int | None) -> FineTuningJob:
    """A job (as the caller's key sees it) as OpenAI's fine-tuning job; `prompts`: its
    training file's, for its epochs."""
    spec = body.spec
    hyperparameters = job_hyperparameters(spec, prompts)
    succeeded = body.status == JobStatus.succeeded and body.final_weights_path is not None
    ended = body.finished_at is not None
    return FineTuningJob(
        id=f"{JOB}{body.id}",
        created_at=int(body.created_at.timestamp()),
        finished_at=seconds(body.finished_at),
        model=spec.student.base_model,
        fine_tuned_model=f"job-{body.id}" if succeeded else None,
        organization_id=organization,
        status=STATUSES[body.status],  # type: ignore[arg-type]
        training_file=training_file(spec),
        validation_file=validation_file(spec),
        hyperparameters=hyperparameters,
        trained_tokens=body.usage.trained_tokens if ended else None,
        error=None
        if body.error is None
        else FineTuningError(code=body.error.code, message=body.error.message),
        seed=spec.student.seed,
        metadata=spec.metadata or None,
        method={
            "type": "distillation",
            "distillation": {
                "hyperparameters": hyperparameters,
                "backend": spec.backend,
                "teachers": {name: t.base_model for name, t in spec.teacher_specs().items()},
                "objective": spec.loop.objective.kind,
            },
        },
    )


def as_event(event: EventPublic) -> FineTuningEvent:
    return FineTuningEvent(
        id=f"{EVENT}{event.id}",
        created_at=int(event.created_at.timestamp()),
        level=LEVELS.get(event.level, "info"),  # type: ignore[arg-type]
        message=event.message,
        data=event.data,
    )


def checkpoint_model(job_id: int, checkpoint: CheckpointPublic) -> str:
    """The chat doors' name of a checkpoint's weights."""
    if checkpoint.kind == CheckpointKind.final:
        return f"job-{job_id}"
    return f"job-{job_id}@step-{checkpoint.step}"


def as_checkpoint(
    job_id: int, checkpoint: CheckpointPublic, metrics: dict[str, float | None]
) -> FineTuningCheckpoint:
    """Saved sampler (or final) weights as OpenAI's checkpoint; `metrics`: the figures of
    the step that made them."""
    figures = {key: metrics[key] for key in CHECKPOINT_METRICS if metrics.get(key) is not None}
    return FineTuningCheckpoint(
        id=f"{CHECKPOINT}{checkpoint.id}",
        created_at=int(checkpoint.created_at.timestamp()),
        fine_tuned_model_checkpoint=checkpoint_model(job_id, checkpoint),
        fine_tuning_job_id=f"{JOB}{job_id}",
        step_number=checkpoint.step,
        metrics=CheckpointMetrics(step=checkpoint.step, **figures),
    )
