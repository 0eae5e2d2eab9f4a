"""Weights a job saved, used by another: `student.init_from` (continue training from a
training state) and `teacher.init_from` (distil from sampler weights a job trained), each
checked against the job it names and completed with the path of what it names.

The job must be one of the team's whose job the new one becomes (an admin key's too: the
worker loads only weights the database records for the job's own team), trained on the
same backend and base model (and, to continue it, LoRA rank), and have the checkpoint
asked for (`final` is what a job saves when it succeeds). Every refusal names the field to
change. The path is always the service's to fill: a path in a submitted spec could point
anywhere on the workers' file system, so one given is refused.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from app.core.config import Settings
from app.jobs.checkpoints import CheckpointUnavailable, sampler_weights, training_state
from app.jobs.errors import JobNotFound, SpecRefused
from app.jobs.rows import get_job
from app.jobs.tables import Checkpoint, Job
from kernel.spec import JobSpec, SavedWeights, stored_spec
from kernel.spec.base import CheckpointRef

Find = Callable[[AsyncSession, Job, CheckpointRef], Awaitable[Checkpoint]]

Matches = list[tuple[str, Any, Callable[[JobSpec], Any]]]
"""(field, its value in the new spec, the same thing in the spec of the job named)."""


@dataclass(frozen=True)
class Use:
    """One way a spec uses saved weights: which field, what must match, what to find, and
    how the spec takes the reference back with its path filled in."""

    field: str
    ref: SavedWeights | None
    purpose: str
    matches: Matches
    find: Find
    fill: Callable[[JobSpec, SavedWeights], JobSpec]


def uses(spec: JobSpec) -> list[Use]:
    """`student.init_from`, and the `init_from` of each teacher (`teacher` or every one of
    `teachers`)."""
    same_backend = ("backend", spec.backend, lambda trained: trained.backend)
    student = Use(
        "student.init_from",
        spec.student.init_from,
        "continuing it",
        [
            same_backend,
            ("student.base_model", spec.student.base_model, lambda t: t.student.base_model),
            ("student.lora_rank", spec.student.lora_rank, lambda t: t.student.lora_rank),
        ],
        training_state,
        lambda s, ref: s.model_copy(
            update={"student": s.student.model_copy(update={"init_from": ref})}
        ),
    )
    return [student, *(teacher_use(spec, name) for name in spec.teacher_specs())]


def teacher_use(spec: JobSpec, name: str) -> Use:
    teacher, field = spec.teacher_specs()[name], spec.teacher_field(name)
    return Use(
        f"{field}.init_from",
        teacher.init_from,
        "a teacher of its weights",
        [
            ("backend", spec.backend, lambda trained: trained.backend),
            (f"{field}.base_model", teacher.base_model, lambda t: t.student.base_model),
        ],
        sampler_weights,
        lambda s, ref: s.with_teacher(
            name, s.teacher_specs()[name].model_copy(update={"init_from": ref})
        ),
    )


async def saved_path(session: AsyncSession, team_id: int, use: Use) -> str:
    """The path of the checkpoint `use.ref` names, once it passed every check."""
    ref = use.ref
    assert ref is not None
    if ref.path is not None:
        raise SpecRefused(f"{use.field}.path", "is filled by the service from job and checkpoint")
    if ref.job is None:
        raise SpecRefused(f"{use.field}.job", "name the job whose weights to use")
    try:
        source = await get_job(session, ref.job, team_id)
    except JobNotFound:
        raise SpecRefused(
            f"{use.field}.job", f"job {ref.job} is not one of your team's jobs"
        ) from None
    trained = stored_spec(source.spec)
    for param, ours, theirs_of in use.matches:
        if (theirs := theirs_of(trained)) != ours:
            raise SpecRefused(
                param, f"job {source.id} trained with {theirs!r}; {use.purpose} needs the same"
            )
    try:
        return (await use.find(session, source, ref.checkpoint)).path
    except CheckpointUnavailable as error:
        raise SpecRefused(f"{use.field}.checkpoint", str(error)) from None


async def fill_init_from(
    session: AsyncSession, team_id: int, spec: JobSpec, settings: Settings | None = None
) -> JobSpec:
    """`spec` with the path of each `init_from` filled in from team `team_id`'s jobs
    (unchanged without one). An admission rule (app/jobs/admission.py: TEAM_RULES)."""
    for use in uses(spec):
        if use.ref is None:
            continue
        filled = use.ref.model_copy(update={"path": await saved_path(session, team_id, use)})
        spec = use.fill(spec, filled)
    return spec


def editable(spec: dict[str, Any]) -> dict[str, Any]:
    """A stored spec as the start of a new one (a clone, the dashboard's form): without the
    paths and uploaded files' objects the service filled, which it fills again for the new
    job (app/jobs/uploads.py)."""

    def bare(part: Any) -> Any:
        init = part.get("init_from") if isinstance(part, dict) else None
        if not (isinstance(init, dict) and "path" in init):
            return part
        return {**part, "init_from": {k: v for k, v in init.items() if k != "path"}}

    def unfilled(dataset: Any) -> Any:
        """Without the object of its file and the rows of its stored completions (their
        `ids` kept: a clone reads the same rows)."""
        if not isinstance(dataset, dict):
            return dataset
        return {k: v for k, v in dataset.items() if k not in ("blob", "rows")}

    spec = {
        **spec,
        **{group: bare(spec[group]) for group in ("student", "teacher") if group in spec},
    }
    if isinstance(spec.get("teachers"), dict):
        spec["teachers"] = {name: bare(part) for name, part in spec["teachers"].items()}
    if "dataset" in spec:
        spec["dataset"] = unfilled(spec["dataset"])
    if isinstance(spec.get("datasets"), list):
        spec["datasets"] = [unfilled(dataset) for dataset in spec["datasets"]]
    if isinstance(spec.get("eval"), dict) and "dataset" in spec["eval"]:
        spec["eval"] = {**spec["eval"], "dataset": unfilled(spec["eval"]["dataset"])}
    return spec
