"""What a job's models are called on the OpenAI-compatible routes: `job-12` (its final
weights), `job-12@step-300` (the sampler weights it saved after step 300), `job-12:teacher`
(its teacher) and `job-12:base` (its student before training). The teacher and the base are
named once the job has final weights, as the playground samples them beside those."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from app.api.deps import MAX_ID
from app.models import Checkpoint, CheckpointKind
from kernel.playground import ModelRole
from kernel.spec import MAX_STEPS, CheckpointRef

NAME = re.compile(r"job-([1-9][0-9]{0,9})(?:@step-(0|[1-9][0-9]{0,5})|:(teacher|base))?")


@dataclass(frozen=True)
class ModelName:
    job_id: int
    checkpoint: CheckpointRef = "final"
    role: ModelRole = "checkpoint"

    def __str__(self) -> str:
        if self.role != "checkpoint":
            return f"job-{self.job_id}:{self.role}"
        if self.checkpoint == "final":
            return f"job-{self.job_id}"
        return f"job-{self.job_id}@step-{self.checkpoint}"


def parse_model(name: str) -> ModelName | None:
    """The model a name means; None for a name no job's model can have."""
    match = NAME.fullmatch(name)
    if match is None:
        return None
    job, step, role = match.groups()
    if int(job) > MAX_ID or (step is not None and int(step) > MAX_STEPS):
        return None
    if step is not None:
        return ModelName(int(job), int(step))
    return ModelName(int(job), role=role or "checkpoint")


def names_of(job_id: int, saved: Iterable[Checkpoint]) -> list[tuple[ModelName, Checkpoint]]:
    """Every name a job's saved sampler weights give a model, with the weights it loads:
    the final ones (and the teacher and the base beside them), then each step's (a step
    saved twice, by a replayed run, loads its newest record)."""
    oldest_first = sorted(saved, key=lambda checkpoint: checkpoint.id)
    by_step = {checkpoint.step: checkpoint for checkpoint in oldest_first}
    finals = [c for c in oldest_first if c.kind == CheckpointKind.final]
    roles: tuple[ModelRole, ...] = ("checkpoint", "teacher", "base") if finals else ()
    return [(ModelName(job_id, role=role), finals[-1]) for role in roles] + [
        (ModelName(job_id, step), by_step[step]) for step in sorted(by_step)
    ]
