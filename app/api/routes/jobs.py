"""Jobs: submit, list, read, and cancel / pause / resume."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Header, Query, Response
from sqlmodel import select

from app.api.deps import (
    Cursor,
    JobId,
    JobSnapshot,
    PrincipalDep,
    QueueDep,
    SessionDep,
    SettingsDep,
    SnapshotsDep,
)
from app.api.errors import ApiError, error_responses
from app.api.pagination import paginate
from app.models import Job, JobAction, JobPublic, JobsPage, JobStatus
from app.queue import enqueue_job
from app.store.errors import JobNotFound
from app.store.jobs import ActionResult, apply_action, create_job
from app.store.rows import get_job
from kernel.datapaths import DataPathError, confine_data_path
from kernel.spec import FileDataset, JobSpec

router = APIRouter(prefix="/v1/jobs", tags=["jobs"], responses=error_responses(401, 422, 503))

MAX_PAGE = 100


def check_dataset_path(spec: JobSpec, data_root: Path) -> None:
    """A 422 for a dataset file outside the data root, before the job is stored."""
    if not isinstance(spec.dataset, FileDataset):
        return
    try:
        confine_data_path(spec.dataset.path, data_root)
    except DataPathError as error:
        raise ApiError(422, "invalid_request", f"dataset.path: {error}", "dataset.path") from error


@router.post(
    "",
    status_code=201,
    response_model=JobPublic,
    responses={
        200: {"model": JobPublic, "description": "Idempotent repeat: the job first created."},
        **error_responses(400, 413),
    },
)
async def submit_job(
    spec: JobSpec,
    session: SessionDep,
    principal: PrincipalDep,
    queue: QueueDep,
    settings: SettingsDep,
    response: Response,
    idempotency_key: Annotated[
        str | None,
        Header(
            alias="Idempotency-Key",
            min_length=1,
            max_length=255,
            description="Same key + same spec = the same job (200); a different spec = 422.",
        ),
    ] = None,
) -> Job:
    """Store the job, then queue it. If the queue is unreachable the job is still created
    (queued, with `queue_reason`) and is sent when the queue is back. A dataset file must
    lie under the server's data root."""
    check_dataset_path(spec, settings.data_root)
    result = await create_job(session, principal.team_id, spec, idempotency_key)
    if not result.changed:
        response.status_code = 200
        return result.job
    await enqueue_job(session, queue, result.job.id)
    return await get_job(session, result.job.id)


@router.get("", response_model=JobsPage)
async def list_jobs(
    session: SessionDep,
    principal: PrincipalDep,
    status: Annotated[JobStatus | None, Query(description="Only jobs in this status.")] = None,
    after: Cursor = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 20,
) -> JobsPage:
    """The caller's jobs (every team's for an admin key), newest first."""
    query = select(Job).order_by(Job.id.desc())
    if principal.scope is not None:
        query = query.where(Job.team_id == principal.scope)
    if status is not None:
        query = query.where(Job.status == status)
    if after is not None:
        query = query.where(Job.id < after)
    return await paginate(session, query, limit, JobsPage)


@router.get("/{job_id}", response_model=JobPublic, responses=error_responses(404))
async def read_job(
    job_id: JobId, session: SessionDep, principal: PrincipalDep, snapshots: SnapshotsDep
) -> Response:
    """The job. Many dashboards polling one job share one database read per
    OPD_JOB_CACHE_SECONDS in each API process."""
    snapshot = snapshots.get(job_id)
    if snapshot is None:
        job = await get_job(session, job_id)
        body = JobPublic.model_validate(job).model_dump_json().encode()
        snapshot = JobSnapshot(team_id=job.team_id, body=body)
        snapshots.put(job_id, snapshot)
    if principal.scope not in (None, snapshot.team_id):
        raise JobNotFound(f"job {job_id} not found")
    return Response(snapshot.body, media_type="application/json")


ACTION_RESPONSES = error_responses(404, 409)


async def act(
    session: SessionDep,
    principal: PrincipalDep,
    snapshots: SnapshotsDep,
    job_id: int,
    action: JobAction,
) -> ActionResult:
    result = await apply_action(session, job_id, action, principal.scope)
    snapshots.drop(job_id)
    return result


@router.post("/{job_id}/cancel", response_model=JobPublic, responses=ACTION_RESPONSES)
async def cancel_job(
    job_id: JobId, session: SessionDep, principal: PrincipalDep, snapshots: SnapshotsDep
) -> Job:
    """A queued or paused job is cancelled at once; a running one becomes `cancelling` until
    its worker stops at the next step boundary. Cancelling a cancelled job is a no-op."""
    return (await act(session, principal, snapshots, job_id, JobAction.cancel)).job


@router.post("/{job_id}/pause", response_model=JobPublic, responses=ACTION_RESPONSES)
async def pause_job(
    job_id: JobId, session: SessionDep, principal: PrincipalDep, snapshots: SnapshotsDep
) -> Job:
    """A queued job is paused at once; a running one becomes `pausing` until its worker saves
    its state at the next step boundary (then `paused`, ready to resume from there)."""
    return (await act(session, principal, snapshots, job_id, JobAction.pause)).job


@router.post("/{job_id}/resume", response_model=JobPublic, responses=ACTION_RESPONSES)
async def resume_job(
    job_id: JobId,
    session: SessionDep,
    principal: PrincipalDep,
    snapshots: SnapshotsDep,
    queue: QueueDep,
) -> Job:
    """A paused job is queued again and continues from its last saved state; a `pausing` job
    simply keeps running. Resuming a queued or running job is a no-op."""
    result = await act(session, principal, snapshots, job_id, JobAction.resume)
    if not (result.changed and result.job.status == JobStatus.queued):
        return result.job
    await enqueue_job(session, queue, job_id)
    snapshots.drop(job_id)
    return await get_job(session, job_id)
