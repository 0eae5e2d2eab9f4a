"""GET /metrics without a key on a second address (OPD_METRICS_LISTEN), for a Prometheus
that reaches the API process on an internal network: the same exposition, no other route.

It runs in the API process (the request counters live there), as a second uvicorn server
on the same event loop, started and stopped with the app.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import uvicorn
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from app.api.routes.prometheus import scrape


def bind(address: str) -> socket.socket:
    """A listening socket on host:port; a clear error when the address cannot be used."""
    host, port = address.rsplit(":", 1)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, int(port)))
    except OSError as error:
        sock.close()
        raise RuntimeError(f"OPD_METRICS_LISTEN={address}: {error.strerror}") from error
    sock.listen(64)
    sock.setblocking(False)
    return sock


@asynccontextmanager
async def metrics_listener(address: str, state: Any) -> AsyncIterator[None]:
    async def metrics(_request: Request) -> Response:
        return Response(await scrape(state), media_type=CONTENT_TYPE_LATEST)

    app = Starlette(routes=[Route("/metrics", metrics)])
    sock = bind(address)
    # No logging setup of its own: the API process's logging stays as `opd api` set it.
    config = uvicorn.Config(app, lifespan="off", log_config=None, log_level=None, access_log=False)
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        yield
    finally:
        server.should_exit = True
        await task
        sock.close()
