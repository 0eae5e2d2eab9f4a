"""What a job's models are called on the OpenAI-compatible routes: `job-12` (its final
weights), `job-12@step-300` (the sampler weights it saved after step 300), `job-12:teacher`
(its teacher) and `job-12:base` (its student before training). The teacher and the base are
named once the job has final weights, as the playground samples them beside those."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from app.api.deps import MAX_ID
from app.jobs.schemas import CheckpointKind
from app.jobs.tables import Checkpoint
from kernel.playground import ModelRole
from kernel.spec.base import MAX_STEPS, CheckpointRef

NAME = re.compile(r"job-([1-9][0-9]{0,9})(?:@step-(0|[1-9][0-9]{0,5})|:(teacher|base))?")
NAME_PATTERN = f"^{NAME.pattern}$"
"""The names `spelled` reads, as the OpenAPI document states them."""


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


def spelled(name: str) -> ModelName | None:
    """What a name says, whether or not a job's model can have it (a page's cursor may
    name any); None when it does not spell a model's name at all."""
    match = NAME.fullmatch(name)
    if match is None:
        return None
    job, step, role = match.groups()
    if step is not None:
        return ModelName(int(job), int(step))
    return ModelName(int(job), role=role or "checkpoint")


def parse_model(name: str) -> ModelName | None:
    """The model a name means; None for a name no job's model can have."""
    meant = spelled(name)
    if meant is None or meant.job_id > MAX_ID:
        return None
    if isinstance(meant.checkpoint, int) and meant.checkpoint > MAX_STEPS:
        return None
    return meant


ROLE_SLOTS: dict[ModelRole, int] = {"checkpoint": -3, "teacher": -2, "base": -1}
"""Where the names of a job's final weights sort among its steps': before every step."""


def position(name: ModelName) -> tuple[int, int]:
    """Where a name is listed: its job (newest first), then its place in `names_of`'s order
    (a step, or a slot before every step)."""
    if name.checkpoint == "final":
        return name.job_id, ROLE_SLOTS[name.role]
    return name.job_id, name.checkpoint


def listed_after(name: ModelName, after: tuple[int, int]) -> bool:
    job_id, slot = position(name)
    return job_id < after[0] or (job_id == after[0] and slot > after[1])


def resumes_after(after: str | None) -> tuple[int, int] | None:
    """The `position` a page of names after `after` starts from; None for the first page
    (no cursor, or one past every job's id)."""
    cursor = None if after is None else spelled(after)
    if cursor is None or cursor.job_id > MAX_ID:
        return None
    return position(cursor)


def listed(
    jobs: Iterable[int], saved: Iterable[Checkpoint], after: tuple[int, int] | None
) -> list[tuple[ModelName, Checkpoint]]:
    """The names the jobs' saved sampler weights give, the jobs in the order given (newest
    first), those listed after the `position` `after` only."""
    of_job: dict[int, list[Checkpoint]] = {job_id: [] for job_id in jobs}
    for checkpoint in saved:
        of_job[checkpoint.job_id].append(checkpoint)
    return [
        (name, checkpoint)
        for job_id, checkpoints in of_job.items()
        for name, checkpoint in names_of(job_id, checkpoints)
        if after is None or listed_after(name, after)
    ]


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
