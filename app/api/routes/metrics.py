"""Step metrics of a job: chart curves, and a live stream of new steps (SSE). A stream
holds one of its team's places in the API process (app/core/waits.py) until it ends."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request, Response
from fastapi.responses import StreamingResponse
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlmodel import select
from starlette.types import Receive, Scope, Send

from app.api.caching import AnswersDep, answer, cache_headers, not_modified
from app.api.curve_params import CurveQueryDep
from app.api.deps import MAX_ID, JobDep, PrincipalDep, SessionDep, SettingsDep, StreamsDep
from app.api.errors import ErrorResponse, error_responses
from app.core.waits import Places
from app.curves.schemas import MetricsPublic
from app.curves.store import read_curves, step_rows
from app.jobs.schemas import TERMINAL_STATUSES, JobStatus
from app.jobs.tables import Job

router = APIRouter(
    prefix="/v1/jobs", tags=["metrics"], responses=error_responses(401, 404, 422, 503)
)

STREAM_BATCH = 500
KEEPALIVE_SECONDS = 15.0
NOT_MODIFIED = {304: {"description": "The curves have not changed since this ETag."}}
ENDS_STREAM = TERMINAL_STATUSES | {JobStatus.paused}
"""A paused job records no step until it is resumed: its stream ends too (open a new one
after resuming, `Last-Event-ID` or `from_step` where it left off)."""


@router.get("/{job_id}/metrics", response_model=MetricsPublic, responses=NOT_MODIFIED)
async def read_metrics(
    job: JobDep, session: SessionDep, request: Request, answers: AnswersDep, query: CurveQueryDep
) -> Response:
    """One curve per metric in step order: every point when the range has at most
    `max_points` steps, else each bucket's min and max point (a spike is never lost) and
    the first and last point; `downsampling` says which. Send the `ETag` back in
    `If-None-Match` to get a 304 while nothing changed; a finished job's curves are
    cacheable for good."""
    headers = cache_headers(request, [job], query)
    if unchanged := not_modified(request, headers):
        return unchanged
    return await answer(answers, headers, lambda: read_curves(session, job.id, query))


def sse(event: str, data: object, event_id: int | None = None) -> str:
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


async def step_events(
    request: Request,
    sessions: async_sessionmaker[AsyncSession],
    job_id: int,
    after: int,
    poll_interval: float,
) -> AsyncIterator[str]:
    """`step` events for steps after `after` as they are recorded, then one `end` event
    with the status once the job has finished or is paused. Each poll uses a short session,
    so no connection is held."""
    idle = 0.0
    while not await request.is_disconnected():
        async with sessions() as session:
            # Status first: a job seen finished has already written all its steps.
            status = (await session.execute(select(Job.status).where(Job.id == job_id))).scalar()
            rows = await step_rows(session, job_id, after, limit=STREAM_BATCH)
        for step, metrics in rows:
            yield sse("step", {"step": step, "metrics": metrics}, step)
            after = step
        if rows:
            idle = 0.0
            continue
        if status in ENDS_STREAM or status is None:
            yield sse("end", {"status": status})
            return
        if idle >= KEEPALIVE_SECONDS:
            idle = 0.0
            yield ": keep-alive\n\n"
        await asyncio.sleep(poll_interval)
        idle += poll_interval


class HeldStream(StreamingResponse):
    """A stream holding one of its team's places, given back however the stream ends (the
    job's end, the client gone, the server stopping)."""

    def __init__(self, content: Any, places: Places, team_id: int, **options: Any) -> None:
        super().__init__(content, **options)
        self.places = places
        self.team_id = team_id

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.places.give_back(self.team_id)


@router.get(
    "/{job_id}/metrics/stream",
    response_class=StreamingResponse,
    responses={
        200: {
            "content": {"text/event-stream": {}},
            "description": "Server-sent events: `step` (id = step, data = {step, metrics}) for "
            "each recorded step, then `end` (data = {status}) once the job has finished or "
            "is paused.",
        },
        429: {
            "model": ErrorResponse,
            "description": "The team (OPD_TEAM_MAX_STREAMS) or the API process "
            "(OPD_MAX_STREAMS) has as many streams open as it may; retry after "
            "`Retry-After` seconds.",
        },
    },
)
async def stream_metrics(
    job: JobDep,
    session: SessionDep,
    request: Request,
    settings: SettingsDep,
    principal: PrincipalDep,
    streams: StreamsDep,
    from_step: Annotated[int, Query(ge=0, le=MAX_ID, description="First step to send.")] = 0,
    last_event_id: Annotated[
        int | None,
        Header(
            alias="Last-Event-ID",
            ge=0,
            le=MAX_ID,
            description="Resume after this step (sent by EventSource).",
        ),
    ] = None,
) -> StreamingResponse:
    """Each step's metrics as the worker records them; ends when the job finishes or is
    paused. Past OPD_TEAM_MAX_STREAMS of the team's streams open in this API process, or
    OPD_MAX_STREAMS of all, a 429 with Retry-After."""
    after = last_event_id if last_event_id is not None else from_step - 1
    await session.close()  # hand the connection back: a stream can stay open for hours
    events = step_events(
        request, request.app.state.sessions, job.id, after, settings.stream_poll_interval
    )
    streams.take(principal.team_id)
    return HeldStream(
        events,
        streams,
        principal.team_id,
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
