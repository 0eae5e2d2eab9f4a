"""Counts every HTTP request by method, route template and status, and times it until the
response starts. Routes are labelled by their template (`/v1/jobs/{job_id}`), never by a
job id, so the number of series stays bounded."""

from __future__ import annotations

import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.core.telemetry import REQUEST_SECONDS, REQUESTS

UNMATCHED = "unmatched"
STATIC = "/ui/static"
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


def method_label(scope: Scope) -> str:
    """The method, or "other" for made-up ones (each would be a new series)."""
    return scope["method"] if scope["method"] in METHODS else "other"


def route_label(scope: Scope) -> str:
    route = scope.get("route")
    path = getattr(route, "path", None)
    if isinstance(path, str):
        return path
    return STATIC if scope.get("path", "").startswith(STATIC + "/") else UNMATCHED


class RequestMetricsMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def timed_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                labels = (method_label(scope), route_label(scope), str(status))
                REQUEST_SECONDS.labels(*labels).observe(time.perf_counter() - started)
            await send(message)

        try:
            await self.app(scope, receive, timed_send)
        finally:
            REQUESTS.labels(method_label(scope), route_label(scope), str(status)).inc()
