"""Continuing a job: a spec's `student.init_from` checked against the job it names and
completed with the path of the saved state the new job starts from.

The job must be the caller's team's (any team's for an admin key), trained on the same
backend, base model and LoRA rank, and have the state asked for (`final` is the state a
job saves when it succeeds). Every refusal names the field to change. The path is always
the service's to fill: a path in a submitted spec could point anywhere on the workers'
file system, so one given is refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from app.store.errors import JobNotFound
from app.store.rows import get_job
from app.store.saved import CheckpointUnavailable, training_state
from kernel.spec import JobSpec


@dataclass
class InitFromRejected(Exception):
    param: str
    message: str

    def __str__(self) -> str:
        return f"{self.param}: {self.message}"


async def continued(session: AsyncSession, scope: int | None, spec: JobSpec) -> JobSpec:
    """`spec` with init_from's state path filled in (unchanged without init_from)."""
    init = spec.student.init_from
    if init is None:
        return spec
    if init.path is not None:
        raise InitFromRejected(
            "student.init_from.path", "is filled by the service from job and checkpoint"
        )
    if init.job is None:
        raise InitFromRejected("student.init_from.job", "name the job to continue")
    try:
        source = await get_job(session, init.job, scope)
    except JobNotFound:
        raise InitFromRejected(
            "student.init_from.job", f"job {init.job} is not one of your team's jobs"
        ) from None
    trained = JobSpec.model_validate(source.spec)
    for param, theirs, ours in (
        ("backend", trained.backend, spec.backend),
        ("student.base_model", trained.student.base_model, spec.student.base_model),
        ("student.lora_rank", trained.student.lora_rank, spec.student.lora_rank),
    ):
        if theirs != ours:
            raise InitFromRejected(
                param, f"job {source.id} trained with {theirs!r}; continuing it needs the same"
            )
    try:
        state = await training_state(session, source, init.checkpoint)
    except CheckpointUnavailable as error:
        raise InitFromRejected("student.init_from.checkpoint", str(error)) from None
    filled = init.model_copy(update={"path": state.path})
    return spec.model_copy(
        update={"student": spec.student.model_copy(update={"init_from": filled})}
    )


def editable(spec: dict[str, Any]) -> dict[str, Any]:
    """A stored spec as the start of a new one (a clone, the dashboard's form): without the
    state path the service filled, which it fills again for the new job."""
    init = (spec.get("student") or {}).get("init_from")
    if not isinstance(init, dict) or "path" not in init:
        return spec
    student = {**spec["student"], "init_from": {k: v for k, v in init.items() if k != "path"}}
    return {**spec, "student": student}
