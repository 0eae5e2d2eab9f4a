"""A job's timeline: every state change and whatever the worker reported."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from sqlmodel import select

from app.api.deps import Cursor, JobDep, PrincipalDep, SessionDep
from app.api.errors import error_responses
from app.api.pagination import paginate
from app.jobs.schemas import EventsPage
from app.jobs.tables import Event
from app.jobs.visibility import team_event

router = APIRouter(
    prefix="/v1/jobs", tags=["events"], responses=error_responses(401, 404, 422, 503)
)


@router.get("/{job_id}/events", response_model=EventsPage)
async def list_events(
    job: JobDep,
    session: SessionDep,
    principal: PrincipalDep,
    after: Cursor = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> EventsPage:
    """Oldest first. A team's keys see no worker folder in them (admin keys do)."""
    query = select(Event).where(Event.job_id == job.id)
    if after is not None:
        query = query.where(Event.id > after)
    page = await paginate(session, query.order_by(Event.id), limit, EventsPage)
    if not principal.is_admin:
        page.data = [team_event(event) for event in page.data]
    return page
