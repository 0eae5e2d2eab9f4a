"""Jobs: submit, list, read, and cancel / pause / resume. Every change is audited."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Query, Request, Response
from sqlalchemy.ext.asyncio import AsyncSession
from sqlmodel import select

from app.api.deps import (
    Cursor,
    JobId,
    JobSnapshot,
    PricesDep,
    PrincipalDep,
    QueueDep,
    SessionDep,
    SettingsDep,
    SnapshotsDep,
)
from app.api.errors import ApiError, error_responses
from app.api.pagination import paginate
from app.audit.store import record_audit
from app.auth.keys import Principal
from app.budgets.estimates import estimate_spec
from app.budgets.schemas import Estimate
from app.budgets.service import admit_spending, refuse_if_exhausted
from app.core.config import Settings
from app.core.idempotency import Idempotency
from app.core.pricing import PriceTable
from app.core.queue import JobQueue
from app.core.tables import utcnow
from app.jobs.dispatch import enqueue_job
from app.jobs.errors import JobNotFound
from app.jobs.filters import JobFilter
from app.jobs.limits import QueueFull
from app.jobs.rows import get_job
from app.jobs.schemas import JobAction, JobPublic, JobsPage, JobStatus
from app.jobs.service import API, show_places, submit_spec
from app.jobs.store import ActionResult, apply_action
from app.jobs.tables import Job
from app.jobs.visibility import team_job
from kernel.spec import JobSpec
from kernel.spec.teachers import priced_teacher

router = APIRouter(prefix="/v1/jobs", tags=["jobs"], responses=error_responses(401, 422, 503))

MAX_PAGE = 100
METADATA_FILTER = r"^[^=,]+=[^,]*(,[^=,]+=[^,]*)*$"
IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        min_length=1,
        max_length=255,
        description=(
            "Same key + same body = what the first request made (200); a different body = 422."
        ),
    ),
]
RETRY_AFTER_SECONDS = 60
"""What a 429 suggests: queued jobs start as slots free up, seldom within a minute."""


def priced(body: JobPublic, prices: PriceTable) -> JobPublic:
    """The job's body with its usage's estimated cost (None without a price for it)."""
    spec, usage = body.spec, body.usage
    usage.estimated_cost = prices.cost(
        spec.backend,
        spec.student.base_model,
        priced_teacher(spec.teacher.base_model, spec.model_dump(include={"teachers"})["teachers"]),
        sampled=usage.sampled_tokens,
        teacher_tokens=usage.teacher_tokens,
        trained=usage.trained_tokens,
        eval_tokens=usage.eval_tokens,
    )
    return body


def shown(body: JobPublic, principal: Principal) -> JobPublic:
    """The body as `principal` sees it: an admin key sees the workers' folders, a team's
    keys their names (app/jobs/visibility.py)."""
    return body if principal.is_admin else team_job(body)


def job_body(job: Job, prices: PriceTable, principal: Principal) -> JobPublic:
    return shown(priced(JobPublic.model_validate(job), prices), principal)


SUBMIT_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"model": JobPublic, "description": "Idempotent repeat: the job first created."},
    **error_responses(400, 403, 413, 415, 429),
}


@dataclass
class Submitter:
    """What submitting a spec needs, for each route that submits one."""

    session: AsyncSession
    principal: Principal
    queue: JobQueue
    settings: Settings
    prices: PriceTable
    response: Response

    async def submit(
        self, spec: JobSpec, idempotency_key: str | None, route: str, body: Any
    ) -> JobPublic:
        """`submit_job`'s work, for every route that makes a job (this one's, OpenAI's
        fine-tuning door's); `body` is the request as sent (what a retry must repeat)."""
        idempotency = None if idempotency_key is None else Idempotency(idempotency_key, route, body)
        await admit_spending(
            self.session, self.principal.team_id, spec, self.prices, utcnow(), idempotency_key
        )
        try:
            result = await submit_spec(
                self.session,
                self.principal,
                self.queue,
                self.settings,
                spec,
                idempotency,
                API,
            )
        except QueueFull as full:
            raise ApiError(
                429,
                "too_many_requests",
                str(full),
                headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
            ) from None
        if not result.changed:
            self.response.status_code = 200
        job = result.job if not result.changed else await get_job(self.session, result.job.id)
        body = job_body(job, self.prices, self.principal)
        await show_places(self.session, [body], self.settings)
        return body


def get_submitter(
    session: SessionDep,
    principal: PrincipalDep,
    queue: QueueDep,
    settings: SettingsDep,
    prices: PricesDep,
    response: Response,
) -> Submitter:
    return Submitter(session, principal, queue, settings, prices, response)


SubmitterDep = Annotated[Submitter, Depends(get_submitter)]


@router.post("", status_code=201, response_model=JobPublic, responses=SUBMIT_RESPONSES)
async def submit_job(
    spec: JobSpec,
    request: Request,
    submitter: SubmitterDep,
    idempotency_key: IdempotencyKey = None,
) -> JobPublic:
    """Store the job, then queue it. If the queue is unreachable the job is still created
    (queued, with `queue_reason`) and is sent when the queue is back. The spec is admitted
    as on every road in (app/jobs/admission.py): a dataset file must lie under the server's data
    root; a `student.init_from` / `teacher.init_from` must name weights one of the team's
    jobs saved (their path is filled in); a `teacher.model_path` must not name another
    team's (app/jobs/weight_paths.py). Over the team's queued limit: 429 with Retry-After; at its
    running limit the job waits, its `queue_reason` says so. With the team's budget spent
    this period: 429 `budget_exceeded` (PUT /v1/teams/{team}/budget); a repeat of a request
    already answered (same Idempotency-Key) still returns its job."""
    body = await request.json() if idempotency_key is not None else None
    return await submitter.submit(spec, idempotency_key, "POST /v1/jobs", body)


@router.post(
    "/estimate", response_model=Estimate, responses=error_responses(400, 403, 404, 413, 415)
)
async def estimate_job(
    spec: JobSpec,
    session: SessionDep,
    principal: PrincipalDep,
    settings: SettingsDep,
    prices: PricesDep,
) -> Estimate:
    """What the job would use, without submitting it: the spec passes the same admission as
    `POST /v1/jobs` (the same 422s) and nothing is stored. Each of `sampled_tokens`,
    `teacher_tokens`, `trained_tokens` and `eval_tokens` (and their `total_tokens`) has a
    `low` bound (every completion stops at its first token), a `high` one (every
    completion runs to max_tokens) and a `point` estimate: from the lengths the team's
    earlier jobs with the same student, teachers and dataset measured (`history` lists
    them), else from the spec alone. `cost` prices each from the price table (null where
    a price is missing, never 0); `basis` says where each figure comes from; `budget`
    compares them with what is left of the team's budget (null: none)."""
    return await estimate_spec(session, principal.team_id, spec, settings, prices, utcnow())


@router.get("", response_model=JobsPage)
async def list_jobs(
    session: SessionDep,
    principal: PrincipalDep,
    prices: PricesDep,
    settings: SettingsDep,
    status: Annotated[JobStatus | None, Query(description="Only jobs in this status.")] = None,
    name: Annotated[
        str, Query(max_length=200, description="Any part of the name, ignoring case.")
    ] = "",
    sweep: Annotated[int | None, Query(ge=1, description="Only this sweep's trials.")] = None,
    metadata: Annotated[
        str | None,
        Query(
            max_length=2000,
            pattern=METADATA_FILTER,
            description="Labels the spec's metadata holds: `key=value`, several comma-separated.",
        ),
    ] = None,
    after: Cursor = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 20,
) -> JobsPage:
    """The caller's jobs (every team's for an admin key), newest first, filtered as the
    dashboard's table filters them; a queued job says where it stands (`queue`) and why it
    waits (`queue_reason`)."""
    pairs = (pair.partition("=") for pair in (metadata.split(",") if metadata else []))
    labels = tuple((key, value) for key, _, value in pairs)
    chosen = JobFilter(status=status, name=name.strip(), sweep=sweep, metadata=labels)
    query = select(Job).order_by(Job.id.desc()).where(*chosen.where())
    if principal.scope is not None:
        query = query.where(Job.team_id == principal.scope)
    if after is not None:
        query = query.where(Job.id < after)
    page = await paginate(session, query, limit, JobsPage)
    page.data = [shown(priced(body, prices), principal) for body in page.data]
    await show_places(session, page.data, settings)
    return page


@router.get("/{job_id}", response_model=JobPublic, responses=error_responses(404))
async def read_job(
    job_id: JobId,
    session: SessionDep,
    principal: PrincipalDep,
    snapshots: SnapshotsDep,
    prices: PricesDep,
    settings: SettingsDep,
) -> Response:
    """The job; while it is queued, where it stands (`queue`: its position, the jobs ahead
    of it, what runs and the worker slots) and why it waits (`queue_reason`). Many
    dashboards polling one job share one database read per OPD_JOB_CACHE_SECONDS in each
    API process."""
    snapshot = snapshots.get(job_id)
    if snapshot is None:
        body = priced(JobPublic.model_validate(await get_job(session, job_id)), prices)
        await show_places(session, [body], settings)
        snapshot = JobSnapshot(
            team_id=body.team_id,
            body=body.model_dump_json().encode(),
            team_body=team_job(body).model_dump_json().encode(),
        )
        snapshots.put(job_id, snapshot)
    if principal.scope not in (None, snapshot.team_id):
        raise JobNotFound(f"job {job_id} not found")
    body = snapshot.body if principal.is_admin else snapshot.team_body
    return Response(body, media_type="application/json")


ACTION_RESPONSES = error_responses(404, 409)


async def act(
    session: SessionDep,
    principal: PrincipalDep,
    snapshots: SnapshotsDep,
    job_id: int,
    action: JobAction,
) -> ActionResult:
    result = await apply_action(session, job_id, action, principal.scope, commit=False)
    detail = {"status": result.job.status, "changed": result.changed}
    await record_audit(session, principal, f"job.{action}", f"job {job_id}", 200, detail)
    snapshots.drop(job_id)
    return result


@router.post("/{job_id}/cancel", response_model=JobPublic, responses=ACTION_RESPONSES)
async def cancel_job(
    job_id: JobId,
    session: SessionDep,
    principal: PrincipalDep,
    snapshots: SnapshotsDep,
    prices: PricesDep,
) -> JobPublic:
    """A queued or paused job is cancelled at once; a running one becomes `cancelling` until
    its worker stops at the next step boundary. Cancelling a cancelled job is a no-op."""
    result = await act(session, principal, snapshots, job_id, JobAction.cancel)
    return job_body(result.job, prices, principal)


@router.post("/{job_id}/pause", response_model=JobPublic, responses=ACTION_RESPONSES)
async def pause_job(
    job_id: JobId,
    session: SessionDep,
    principal: PrincipalDep,
    snapshots: SnapshotsDep,
    prices: PricesDep,
) -> JobPublic:
    """A queued job is paused at once; a running one becomes `pausing` until its worker saves
    its state at the next step boundary (then `paused`, ready to resume from there)."""
    result = await act(session, principal, snapshots, job_id, JobAction.pause)
    return job_body(result.job, prices, principal)


@router.post("/{job_id}/resume", response_model=JobPublic, responses=ACTION_RESPONSES)
async def resume_job(
    job_id: JobId,
    session: SessionDep,
    principal: PrincipalDep,
    snapshots: SnapshotsDep,
    queue: QueueDep,
    prices: PricesDep,
    settings: SettingsDep,
) -> JobPublic:
    """A paused job is queued again and continues from its last saved state; a `pausing` job
    simply keeps running. Resuming a queued or running job is a no-op. While the job's
    team has spent its budget, a paused job stays paused: 429 `budget_exceeded` (it would
    pause again before its first step; it resumes by itself when the budget allows)."""
    body = job_body(
        await resume(session, principal, snapshots, queue, prices, job_id), prices, principal
    )
    await show_places(session, [body], settings)
    return body


async def resume(
    session: AsyncSession,
    principal: Principal,
    snapshots: SnapshotsDep,
    queue: JobQueue,
    prices: PriceTable,
    job_id: int,
) -> Job:
    """Resume the job (audited), sending it to the queue once it is queued again; a paused
    job of a team that has spent its budget stays paused (BudgetExceeded)."""
    job = await get_job(session, job_id, principal.scope)
    if job.status == JobStatus.paused:
        await refuse_if_exhausted(session, job.team_id, prices, utcnow())
    result = await act(session, principal, snapshots, job_id, JobAction.resume)
    if not (result.changed and result.job.status == JobStatus.queued):
        return result.job
    await enqueue_job(session, queue, job_id)
    snapshots.drop(job_id)
    return await get_job(session, job_id)
