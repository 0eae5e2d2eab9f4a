"""The playground's API side, for the JSON API and the dashboard alike: a request checked
against the job's saved weights, handed to a worker as a short task with a deadline, and
its answer read back, with the database session closed while it waits (app/waits.py). The
API process never loads a model."""

from __future__ import annotations

import time
from dataclasses import dataclass

from pydantic import Field
from sqlalchemy.ext.asyncio import AsyncSession

from app.continuation import SpecRefused
from app.core.config import Settings
from app.models import CheckpointPublic, Job
from app.queue import JobQueue, QueueUnavailable
from app.store.saved import CheckpointUnavailable, sampler_weights
from app.waits import Waits
from app.weight_paths import checked_weights
from app.worker_tasks import SAMPLE_TASK, TaskUnanswered, call_worker
from kernel.playground import Outcome, SampleAnswer, SampleRequest, SampleTask, TaskFailure
from kernel.spec import JobSpec

REJECTED = {
    "invalid_prompt",
    "backend_rejected",
    "model_not_found",
    "incompatible_models",
    "checkpoint_config_mismatch",
    "model_too_large",
}
"""Worker failure codes that say the request (or the job's spec) cannot be served: 422."""
STATUS = {"bad_checkpoint": 409, "worker_timeout": 504, "deadline_passed": 504}
"""Other codes with a status of their own; the rest are the worker's or backend's: 502."""


class PlaygroundAnswer(SampleAnswer):
    job_id: int
    checkpoint: CheckpointPublic = Field(description="The saved weights that were sampled.")


@dataclass
class PlaygroundError(Exception):
    status: int
    code: str
    message: str
    param: str | None = None


def failed(failure: TaskFailure) -> PlaygroundError:
    status = 422 if failure.code in REJECTED else STATUS.get(failure.code, 502)
    return PlaygroundError(status, failure.code, failure.message)


async def try_checkpoint(
    session: AsyncSession,
    queue: JobQueue,
    settings: Settings,
    waits: Waits,
    team_id: int,
    job: Job,
    request: SampleRequest,
) -> PlaygroundAnswer:
    """The completions the request asks for, from a worker, waited for in one of the
    caller's team's places (TooManyWaiting when it has none left); PlaygroundError
    otherwise."""
    spec = JobSpec.model_validate(job.spec)
    teachers = spec.teacher_specs()
    if request.teacher is not None and request.teacher not in teachers:
        message = f"job {job.id} has no teacher {request.teacher!r} (it has {', '.join(teachers)})"
        raise PlaygroundError(422, "invalid_request", f"teacher: {message}", "teacher")
    try:
        checkpoint = await sampler_weights(session, job, request.checkpoint)
    except CheckpointUnavailable as error:
        raise PlaygroundError(422, "invalid_request", str(error), "checkpoint") from None
    try:
        spec = await checked_weights(session, job.team_id, spec, settings)
    except SpecRefused as error:
        raise PlaygroundError(422, "invalid_request", str(error), error.param) from None
    timeout = request.timeout_seconds or settings.sample_timeout
    task = SampleTask(
        request=request,
        spec=spec,
        weights_path=checkpoint.path,
        deadline=time.time() + timeout,
    )
    try:
        async with waits.released(session, team_id):
            raw = await call_worker(queue, SAMPLE_TASK, task.model_dump_json(), timeout)
    except TaskUnanswered as error:
        raise failed(error.failure) from None
    except QueueUnavailable as error:
        raise PlaygroundError(503, "queue_unavailable", str(error)) from None
    outcome = Outcome[SampleAnswer].model_validate_json(raw)
    if outcome.value is None:
        raise failed(outcome.failure or TaskFailure(code="worker_failed", message="no answer"))
    return PlaygroundAnswer(
        **outcome.value.model_dump(),
        job_id=job.id,
        checkpoint=CheckpointPublic.model_validate(checkpoint),
    )
