"""Conditional reads of a job's metrics: polling an unchanged job costs one job row.

The ETag is a digest of each job's state (status, progress, last change) and of the
request, so it changes whenever a step is recorded or replayed, and a matching
`If-None-Match` is answered 304 before any metric is read. A finished job's metrics never
change: they may be cached for good. Everything is `private`: answers depend on the key.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from fastapi import Request, Response

from app.models import TERMINAL_STATUSES, Job

FORMAT_VERSION = 1  # bump when a response's format changes, so cached copies stop matching
FOREVER = "private, max-age=31536000, immutable"
REVALIDATE = "private, no-cache"
VARY = "Authorization, X-API-Key, Cookie"


def etag(jobs: Sequence[Job], *request: object) -> str:
    state = [(job.id, job.status, job.steps_done, job.updated_at.isoformat()) for job in jobs]
    digest = hashlib.sha256(repr((FORMAT_VERSION, state, request)).encode()).hexdigest()
    return f'"{digest[:32]}"'


def cache_headers(jobs: Sequence[Job], *request: object) -> dict[str, str]:
    """ETag, Cache-Control and Vary for an answer about `jobs` to `request`."""
    final = all(job.status in TERMINAL_STATUSES for job in jobs)
    return {
        "ETag": etag(jobs, *request),
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
