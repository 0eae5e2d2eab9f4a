"""Saved weights of a job: resumable states, sampler weights and the final weights."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from sqlmodel import select

from app.api.deps import Cursor, JobDep, PrincipalDep, SessionDep
from app.api.errors import error_responses
from app.api.pagination import paginate
from app.jobs.schemas import CheckpointKind, CheckpointsPage
from app.jobs.tables import Checkpoint
from app.jobs.visibility import team_checkpoint

router = APIRouter(
    prefix="/v1/jobs", tags=["checkpoints"], responses=error_responses(401, 404, 422, 503)
)


@router.get("/{job_id}/checkpoints", response_model=CheckpointsPage)
async def list_checkpoints(
    job: JobDep,
    session: SessionDep,
    principal: PrincipalDep,
    kind: Annotated[CheckpointKind | None, Query(description="Only this kind.")] = None,
    after: Cursor = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> CheckpointsPage:
    """Oldest first. `path`: the `opd-store://` name or the backend's URI as recorded; a
    worker's folder is shown to a team's keys from the job's folder on (admin keys see it
    whole)."""
    query = select(Checkpoint).where(Checkpoint.job_id == job.id)
    if kind is not None:
        query = query.where(Checkpoint.kind == kind)
    if after is not None:
        query = query.where(Checkpoint.id > after)
    page = await paginate(session, query.order_by(Checkpoint.id), limit, CheckpointsPage)
    if not principal.is_admin:
        page.data = [team_checkpoint(checkpoint) for checkpoint in page.data]
    return page
