"""OpenAI's fine-tuning doors, so that the `openai` package creates, lists, follows, pauses,
resumes and cancels this service's jobs (`client.fine_tuning.jobs.*`): each route is the
jobs' own (the same submit, actions, events and checkpoints) in OpenAI's shapes and its
errors' (app/fine_tuning). A job made here is a job like any other, and every job of the
team is listed here."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from sqlalchemy.ext.asyncio import AsyncSession

from app.api.deps import (
    MAX_ID,
    JobSnapshot,
    PricesDep,
    PrincipalDep,
    QueueDep,
    SessionDep,
    SnapshotsDep,
)
from app.api.errors import ApiError, error_responses
from app.api.openai.errors import OpenAIRoute, openai_error_responses
from app.api.routes.jobs import IdempotencyKey, SubmitterDep, act, resume
from app.auth.keys import Principal
from app.core.cache import TTLCache
from app.core.pricing import PriceTable
from app.core.queue import JobQueue
from app.fine_tuning.mapping import CHECKPOINT, EVENT, JOB, openai_loc, openai_param, public_number
from app.fine_tuning.schemas import (
    FineTuningCheckpoints,
    FineTuningEvents,
    FineTuningJob,
    FineTuningJobCreate,
    FineTuningJobs,
)
from app.fine_tuning.service import (
    checkpoints_page,
    events_page,
    fine_tuning_job,
    jobs_page,
    spec_for,
)
from app.jobs.errors import JobNotFound, SpecNotFound, SpecRefused
from app.jobs.rows import get_job
from app.jobs.schemas import JobAction

router = APIRouter(prefix="/v1/fine_tuning", tags=["fine-tuning"], route_class=OpenAIRoute)

MAX_PAGE = 100
ROUTE = "POST /v1/fine_tuning/jobs"
"""What a create's Idempotency-Key is bound to, with its body."""
METADATA_QUERY = re.compile(r"^metadata\[(.{1,64})\]$")
FineTuningJobId = Annotated[
    str, Path(max_length=32, description="`ftjob-N`, the job N of the rest of the API.")
]
Limit = Annotated[int, Query(ge=1, le=MAX_PAGE)]
READ_RESPONSES = openai_error_responses(400, 401, 403, 404)


def cursor(prefix: str) -> Any:
    """A page's `after`: the previous page's `last_id`, an id of this prefix."""
    return Query(
        max_length=32,
        pattern=f"^{prefix}[1-9][0-9]{{0,9}}$",
        description=f"A page's `last_id` ({prefix}N): the page after it.",
    )


def after_id(after: str | None, prefix: str) -> int | None:
    """A page's cursor as the row id it follows (one past every id: the first page)."""
    if after is None:
        return None
    return min(int(after.removeprefix(prefix)), MAX_ID)


def job_number(fine_tuning_job_id: str) -> int:
    """The job an `ftjob-N` id names (an id that names none: the same 404 as another team's)."""
    number = public_number(fine_tuning_job_id, JOB)
    if number is None:
        raise not_found(fine_tuning_job_id)
    return number


def not_found(fine_tuning_job_id: str) -> ApiError:
    return ApiError(
        404,
        "not_found",
        f"No fine-tuning job {fine_tuning_job_id}, or it is another team's.",
        "fine_tuning_job_id",
    )


def in_request_terms(error: SpecRefused) -> SpecRefused:
    """Admission's refusal of the spec's field as a refusal of the request's
    (`dataset.file`: `training_file`)."""
    param = openai_param(error.param)
    kind = SpecNotFound if isinstance(error, SpecNotFound) else SpecRefused
    return kind(param, error.message)


@router.post(
    "/jobs",
    response_model=FineTuningJob,
    responses=openai_error_responses(400, 401, 403, 404, 409, 429) | error_responses(413, 415),
)
async def create_fine_tuning_job(
    body: FineTuningJobCreate,
    request: Request,
    session: SessionDep,
    principal: PrincipalDep,
    submitter: SubmitterDep,
    idempotency_key: IdempotencyKey = None,
) -> FineTuningJob:
    """A job of the caller's team, as `POST /v1/jobs` makes one (the same admission,
    budget, queue and audit): `model` is the student, `training_file` its dataset (a table
    of questions or conversations), `validation_file` its eval's, `seed` the student's,
    `suffix` its name, `metadata` its labels; `method` must be `{type: distillation,
    distillation: {...}}`, the job spec's own fields (a `teacher` or `teachers`,
    `backend` (default `local`), `loop`, `sampling`, `eval`, `dataset`'s options such as
    `turns`, ...) with OpenAI's `hyperparameters` (`n_epochs`: steps over the file's
    prompts; `batch_size`; `learning_rate_multiplier`: of the student's default rate).
    Any other method is a 400 (`supervised`, `dpo` and `reinforcement` train on targets
    this service does not: it distils); a field given both ways is a 400 naming it."""
    try:
        spec = await spec_for(session, principal.team_id, body)
    except ValidationError as invalid:
        raise RequestValidationError(
            [e | {"loc": ("body", *openai_loc(tuple(e["loc"])))} for e in invalid.errors()]
        ) from None
    raw = await request.json() if idempotency_key is not None else None
    try:
        job = await submitter.submit(spec, idempotency_key, ROUTE, raw)
    except SpecRefused as refused:
        raise in_request_terms(refused) from None
    submitter.response.status_code = 200
    return await fine_tuning_job(session, principal, job)


@router.get("/jobs", response_model=FineTuningJobs, responses=READ_RESPONSES)
async def list_fine_tuning_jobs(
    request: Request,
    session: SessionDep,
    principal: PrincipalDep,
    after: Annotated[str | None, cursor(JOB)] = None,
    limit: Limit = 20,
) -> FineTuningJobs:
    """The team's jobs, newest first, whichever door made them (every team's for an admin
    key); `metadata[key]=value` keeps those whose metadata holds it."""
    labels = tuple(
        (match.group(1), value)
        for name, value in request.query_params.multi_items()
        if (match := METADATA_QUERY.match(name))
    )
    return await jobs_page(session, principal, after_id(after, JOB), limit, labels)


@router.get("/jobs/{fine_tuning_job_id}", response_model=FineTuningJob, responses=READ_RESPONSES)
async def retrieve_fine_tuning_job(
    fine_tuning_job_id: FineTuningJobId, session: SessionDep, principal: PrincipalDep
) -> FineTuningJob:
    """The job."""
    try:
        job = await get_job(session, job_number(fine_tuning_job_id), principal.scope)
    except JobNotFound:
        raise not_found(fine_tuning_job_id) from None
    return await fine_tuning_job(session, principal, job)


@dataclass
class Acting:
    """What asking an action of a job needs."""

    session: AsyncSession
    principal: Principal
    snapshots: TTLCache[int, JobSnapshot]
    queue: JobQueue
    prices: PriceTable

    async def __call__(self, fine_tuning_job_id: str, action: JobAction) -> FineTuningJob:
        """The job once `action` is asked of it, as `POST /v1/jobs/{id}/<action>` asks it
        (audited; a status that does not allow it: 409; resuming a paused job of a team
        that spent its budget: 429 `budget_exceeded`)."""
        job_id = job_number(fine_tuning_job_id)
        session, principal, snapshots = self.session, self.principal, self.snapshots
        try:
            if action == JobAction.resume:
                job = await resume(session, principal, snapshots, self.queue, self.prices, job_id)
            else:
                job = (await act(session, principal, snapshots, job_id, action)).job
        except JobNotFound:
            raise not_found(fine_tuning_job_id) from None
        return await fine_tuning_job(session, principal, job)


def get_acting(
    session: SessionDep,
    principal: PrincipalDep,
    snapshots: SnapshotsDep,
    queue: QueueDep,
    prices: PricesDep,
) -> Acting:
    return Acting(session, principal, snapshots, queue, prices)


ActingDep = Annotated[Acting, Depends(get_acting)]
ACTION_RESPONSES = openai_error_responses(400, 401, 403, 404, 409)


@router.post(
    "/jobs/{fine_tuning_job_id}/cancel", response_model=FineTuningJob, responses=ACTION_RESPONSES
)
async def cancel_fine_tuning_job(
    fine_tuning_job_id: FineTuningJobId, acting: ActingDep
) -> FineTuningJob:
    """Cancel: a queued or paused job at once, a running one at its next step boundary
    (`running` until then)."""
    return await acting(fine_tuning_job_id, JobAction.cancel)


@router.post(
    "/jobs/{fine_tuning_job_id}/pause", response_model=FineTuningJob, responses=ACTION_RESPONSES
)
async def pause_fine_tuning_job(
    fine_tuning_job_id: FineTuningJobId, acting: ActingDep
) -> FineTuningJob:
    """Pause: a running job saves its state at its next step boundary (then `paused`)."""
    return await acting(fine_tuning_job_id, JobAction.pause)


@router.post(
    "/jobs/{fine_tuning_job_id}/resume", response_model=FineTuningJob, responses=ACTION_RESPONSES
)
async def resume_fine_tuning_job(
    fine_tuning_job_id: FineTuningJobId, acting: ActingDep
) -> FineTuningJob:
    """Resume a paused job from its last saved state."""
    return await acting(fine_tuning_job_id, JobAction.resume)


@router.get(
    "/jobs/{fine_tuning_job_id}/events", response_model=FineTuningEvents, responses=READ_RESPONSES
)
async def list_fine_tuning_events(
    fine_tuning_job_id: FineTuningJobId,
    session: SessionDep,
    principal: PrincipalDep,
    after: Annotated[str | None, cursor(EVENT)] = None,
    limit: Limit = 20,
) -> FineTuningEvents:
    """The job's events, newest first: every state change and what its worker reported."""
    try:
        job_id = job_number(fine_tuning_job_id)
        return await events_page(session, principal, job_id, after_id(after, EVENT), limit)
    except JobNotFound:
        raise not_found(fine_tuning_job_id) from None


@router.get(
    "/jobs/{fine_tuning_job_id}/checkpoints",
    response_model=FineTuningCheckpoints,
    responses=READ_RESPONSES,
)
async def list_fine_tuning_checkpoints(
    fine_tuning_job_id: FineTuningJobId,
    session: SessionDep,
    principal: PrincipalDep,
    after: Annotated[str | None, cursor(CHECKPOINT)] = None,
    limit: Limit = 10,
) -> FineTuningCheckpoints:
    """The job's saved sampler and final weights, newest first, each a model of
    `/v1/chat/completions` (`fine_tuned_model_checkpoint`)."""
    try:
        job_id = job_number(fine_tuning_job_id)
        return await checkpoints_page(
            session, principal, job_id, after_id(after, CHECKPOINT), limit
        )
    except JobNotFound:
        raise not_found(fine_tuning_job_id) from None
