"""Step metrics of a job: downsampled curves, and a live stream of new steps (SSE)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import StreamingResponse
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlmodel import select

from app.api.deps import MAX_ID, JobDep, SessionDep, SettingsDep
from app.api.errors import ApiError, error_responses
from app.curves import build_curves
from app.models import TERMINAL_STATUSES, Job, MetricsPublic, StepMetric

router = APIRouter(
    prefix="/v1/jobs", tags=["metrics"], responses=error_responses(401, 404, 422, 503)
)

MAX_KEYS = 100
STREAM_BATCH = 500
KEEPALIVE_SECONDS = 15.0


def parse_keys(keys: str | None) -> list[str] | None:
    if keys is None:
        return None
    names = list(dict.fromkeys(name.strip() for name in keys.split(",") if name.strip()))
    if not names:
        raise ApiError(422, "invalid_request", "keys: give at least one metric name", "keys")
    if len(names) > MAX_KEYS:
        raise ApiError(422, "invalid_request", f"keys: at most {MAX_KEYS} names", "keys")
    return names


@router.get("/{job_id}/metrics", response_model=MetricsPublic)
async def read_metrics(
    job: JobDep,
    session: SessionDep,
    keys: Annotated[
        str | None,
        Query(
            description="Comma-separated metric names, e.g. `opd/reverse_kl_mean`; "
            "default: every metric the job recorded."
        ),
    ] = None,
    from_step: Annotated[
        int | None, Query(ge=0, le=MAX_ID, description="First step (inclusive).")
    ] = None,
    to_step: Annotated[
        int | None, Query(ge=0, le=MAX_ID, description="Last step (inclusive).")
    ] = None,
    max_points: Annotated[
        int, Query(ge=2, le=10_000, description="Points per curve at most; first and last kept.")
    ] = 1000,
) -> MetricsPublic:
    """One curve per metric, in step order, evenly downsampled to `max_points`."""
    names = parse_keys(keys)
    if from_step is not None and to_step is not None and from_step > to_step:
        raise ApiError(422, "invalid_request", "from_step must not exceed to_step", "from_step")
    query = select(StepMetric.step, StepMetric.metrics).where(StepMetric.job_id == job.id)
    if from_step is not None:
        query = query.where(StepMetric.step >= from_step)
    if to_step is not None:
        query = query.where(StepMetric.step <= to_step)
    rows = (await session.execute(query.order_by(StepMetric.step))).tuples()
    return MetricsPublic(job_id=job.id, curves=build_curves(rows, names, max_points))


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
    with the final status. Each poll uses a short session, so no connection is held."""
    idle = 0.0
    while not await request.is_disconnected():
        async with sessions() as session:
            # Status first: a job seen finished has already written all its steps.
            status = (await session.execute(select(Job.status).where(Job.id == job_id))).scalar()
            rows = (
                (
                    await session.execute(
                        select(StepMetric.step, StepMetric.metrics)
                        .where(StepMetric.job_id == job_id, StepMetric.step > after)
                        .order_by(StepMetric.step)
                        .limit(STREAM_BATCH)
                    )
                )
                .tuples()
                .all()
            )
        for step, metrics in rows:
            yield sse("step", {"step": step, "metrics": metrics}, step)
            after = step
        if rows:
            idle = 0.0
            continue
        if status in TERMINAL_STATUSES or status is None:
            yield sse("end", {"status": status})
            return
        if idle >= KEEPALIVE_SECONDS:
            idle = 0.0
            yield ": keep-alive\n\n"
        await asyncio.sleep(poll_interval)
        idle += poll_interval


@router.get(
    "/{job_id}/metrics/stream",
    response_class=StreamingResponse,
    responses={
        200: {
            "content": {"text/event-stream": {}},
            "description": "Server-sent events: `step` (id = step, data = {step, metrics}) for "
            "each recorded step, then `end` (data = {status}) once the job has finished.",
        }
    },
)
async def stream_metrics(
    job: JobDep,
    session: SessionDep,
    request: Request,
    settings: SettingsDep,
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
    """Each step's metrics as the worker records them; ends when the job finishes."""
    after = last_event_id if last_event_id is not None else from_step - 1
    await session.close()  # hand the connection back: a stream can stay open for hours
    events = step_events(
        request, request.app.state.sessions, job.id, after, settings.stream_poll_interval
    )
    return StreamingResponse(
        events,
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
