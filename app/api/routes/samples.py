"""The rollouts a job kept: what the student wrote, each token with its reverse KL."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from sqlmodel import select

from app.api.deps import MAX_ID, Cursor, JobDep, SessionDep
from app.api.errors import error_responses
from app.api.pagination import paginate
from app.samples.schemas import SamplesPage
from app.samples.tables import Sample

router = APIRouter(
    prefix="/v1/jobs", tags=["samples"], responses=error_responses(401, 404, 422, 503)
)


@router.get("/{job_id}/samples", response_model=SamplesPage)
async def list_samples(
    job: JobDep,
    session: SessionDep,
    step: Annotated[int | None, Query(ge=0, le=MAX_ID, description="Only this step's.")] = None,
    after: Cursor = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
) -> SamplesPage:
    """In the order they were kept (step order). A job keeps `loop.keep_samples` per step,
    on evenly spread steps once a long job would keep too many."""
    query = select(Sample).where(Sample.job_id == job.id)
    if step is not None:
        query = query.where(Sample.step == step)
    if after is not None:
        query = query.where(Sample.id > after)
    return await paginate(session, query.order_by(Sample.id), limit, SamplesPage)
