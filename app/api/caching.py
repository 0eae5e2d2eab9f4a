"""Conditional reads of a job's metrics: polling an unchanged job costs one job row.

The ETag is a digest of each job's state (status, progress, last change), of the route
and of the request, so it changes whenever a step is recorded or replayed, and a matching
`If-None-Match` is answered 304 before any metric is read. A finished job's metrics never
change: they may be cached for good. Everything is `private`: answers depend on the key.
Dashboards that watch the same job share its answer: each process keeps recent answers
by ETag (`answer`), so a job's curves are read once per change, not once per poll.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Annotated

from fastapi import Depends, Request, Response
from pydantic import BaseModel

from app.core.cache import TTLCache
from app.jobs.schemas import TERMINAL_STATUSES
from app.jobs.tables import Job

FORMAT_VERSION = 1  # bump when a response's format changes, so cached copies stop matching
FOREVER = "private, max-age=31536000, immutable"
REVALIDATE = "private, no-cache"
VARY = "Authorization, X-API-Key, Cookie"
ANSWER_SECONDS = 60.0  # an answer is right as long as its ETag: this only bounds memory
ANSWERS = 256
ANSWER_BYTES = 256 * 1024  # larger answers are not kept


def route_of(request: Request) -> str:
    """The route's path template: two routes never share an ETag (or a kept answer),
    whatever their queries."""
    route = request.scope.get("route")
    return getattr(route, "path", request.url.path)


def etag(route: str, jobs: Sequence[Job], *query: object) -> str:
    state = [(job.id, job.status, job.steps_done, job.updated_at.isoformat()) for job in jobs]
    digest = hashlib.sha256(repr((FORMAT_VERSION, route, state, query)).encode()).hexdigest()
    return f'"{digest[:32]}"'


def cache_headers(request: Request, jobs: Sequence[Job], *query: object) -> dict[str, str]:
    """ETag, Cache-Control and Vary for the route's answer about `jobs` to `query`."""
    final = all(job.status in TERMINAL_STATUSES for job in jobs)
    return {
        "ETag": etag(route_of(request), jobs, *query),
        "Cache-Control": FOREVER if final else REVALIDATE,
        "Vary": VARY,
    }


def not_modified(request: Request, headers: dict[str, str]) -> Response | None:
    """A 304 when the client's If-None-Match holds the current ETag (weakly compared)."""
    sent = request.headers.get("if-none-match")
    if sent is None:
        return None
    tags = {tag.strip().removeprefix("W/") for tag in sent.split(",")}
    if "*" in tags or headers["ETag"] in tags:
        return Response(status_code=304, headers=headers)
    return None


def get_answers(request: Request) -> TTLCache[str, bytes]:
    return request.app.state.curve_answers


AnswersDep = Annotated[TTLCache[str, bytes], Depends(get_answers)]


async def answer(
    answers: TTLCache[str, bytes],
    headers: dict[str, str],
    read: Callable[[], Awaitable[BaseModel]],
) -> Response:
    """The JSON answer for this ETag: kept from an earlier request, else read and kept.
    A kept answer is at least as new as its ETag (the job row is read before the curves)."""
    body = answers.get(headers["ETag"])
    if body is None:
        body = (await read()).model_dump_json().encode()
        if len(body) <= ANSWER_BYTES:
            answers.put(headers["ETag"], body)
    return Response(body, media_type="application/json", headers=headers)
