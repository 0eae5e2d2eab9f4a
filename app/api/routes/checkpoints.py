"""Saved weights of a job: resumable states, sampler weights and the final weights."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from sqlmodel import select

from app.api.deps import Cursor, JobDep, SessionDep
from app.api.errors import error_responses
from app.api.pagination import paginate
from app.jobs.schemas import CheckpointKind, CheckpointsPage
from app.jobs.tables import Checkpoint

router = APIRouter(
    prefix="/v1/jobs", tags=["checkpoints"], responses=error_responses(401, 404, 422, 503)
)


@router.get("/{job_id}/checkpoints", response_model=CheckpointsPage)
async def list_checkpoints(
    job: JobDep,
    session: SessionDep,
    kind: Annotated[CheckpointKind | None, Query(description="Only this kind.")] = None,
    after: Cursor = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> CheckpointsPage:
    """Oldest first."""
    query = select(Checkpoint).where(Checkpoint.job_id == job.id)
    if kind is not None:
        query = query.where(Checkpoint.kind == kind)
    if after is not None:
        query = query.where(Checkpoint.id > after)
    return await paginate(session, query.order_by(Checkpoint.id), limit, CheckpointsPage)
