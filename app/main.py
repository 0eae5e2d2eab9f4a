"""The FastAPI application: `create_app()` wires settings, database, queue and routes.

Run it with `uvicorn --factory app.main:create_app`. Nothing here imports torch or
the worker package; jobs reach the workers through Redis by task name.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

from fastapi import APIRouter, Depends, FastAPI

import app.tables  # noqa: F401  (every table in the metadata before a flush)
from app.api.body_limit import BodyLimitMiddleware
from app.api.caching import ANSWER_SECONDS, ANSWERS
from app.api.deps import JobSnapshot, document_scopes, one_value_each
from app.api.errors import install_error_handlers
from app.api.instrumentation import RequestMetricsMiddleware
from app.api.metrics_listener import metrics_listener
from app.api.routes import (
    audit,
    checkpoints,
    clone,
    compare,
    downloads,
    events,
    export,
    files,
    fine_tuning,
    health,
    jobs,
    keys,
    metrics,
    openai,
    playground,
    prometheus,
    samples,
    stored_completions,
    sweeps,
    teams,
    usage,
    webhooks,
)
from app.auth.job_tokens import JobTokens
from app.auth.keys import Principal
from app.core.cache import TTLCache
from app.core.config import Settings, get_settings
from app.core.db import migrate, service_engine, session_factory
from app.core.encryption import secret_box
from app.core.pricing import PriceTable
from app.core.queue import JobQueue
from app.core.storage import storage_of
from app.core.waits import Limit, Places, Waits
from app.files.service import remove_stale_spools, spool_folder, spool_places
from app.web.site import install_dashboard

api_router = APIRouter(dependencies=[Depends(one_value_each)])
for module in (health, jobs, metrics, export, compare, checkpoints, events, samples, prometheus):
    document_scopes(module.router.routes)
    api_router.include_router(module.router)
for module in (
    usage,
    webhooks,
    audit,
    teams,
    keys,
    playground,
    clone,
    downloads,
    sweeps,
    openai,
    stored_completions,
    fine_tuning,
):
    document_scopes(module.router.routes)
    api_router.include_router(module.router)
document_scopes(files.router.routes)
api_router.include_router(files.router)

STREAMED_BODIES = frozenset({("POST", "/v1/files"), ("POST", "/ui/files/upload")})
"""Routes that stream their body and bound it themselves (body_limit.py lets them pass)."""

DESCRIPTION = """\
Submit on-policy distillation jobs, follow their metrics and collect their weights.

Authenticate with `Authorization: Bearer KEY` or `X-API-Key: KEY` (keys come from
`opd keys create --team NAME`). Every job belongs to the key's team; other teams' jobs
answer 404. Errors look like `{"error": {"code", "message", "param"}}`, except on the
OpenAI-compatible routes (`/v1/chat/completions`, `/v1/completions`, `/v1/models`), which
speak OpenAI's format, errors included: `{"error": {"message", "type", "param", "code"}}`.

A key's scope decides what it may do: `read` (GET only), `submit` (also create and act on
its team's jobs and webhooks), `admin` (every team, keys, teams' limits). Each operation
names the scope it needs in `x-opd-scope`; a request beyond the key's scope is a 403.
"""


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()
    engine = service_engine(settings)
    queue = JobQueue(settings.redis_url, settings.queue_name, settings.connect_timeout)

    @asynccontextmanager
    async def lifespan(running: FastAPI) -> AsyncIterator[None]:
        if settings.migrate_on_start:
            await asyncio.to_thread(migrate, settings.database_url, settings=settings)
        await asyncio.to_thread(remove_stale_spools, spool_folder(settings))
        async with AsyncExitStack() as stack:
            if settings.metrics_listen:
                listener = metrics_listener(settings.metrics_listen, running.state)
                await stack.enter_async_context(listener)
            yield
        await queue.close()
        await engine.dispose()

    app = FastAPI(title="OPD service", version="1", description=DESCRIPTION, lifespan=lifespan)
    app.state.settings = settings
    app.state.engine = engine
    app.state.sessions = session_factory(engine)
    app.state.queue = queue
    app.state.principals = TTLCache[str, Principal](settings.auth_cache_seconds)
    app.state.snapshots = TTLCache[int, JobSnapshot](settings.job_cache_seconds)
    app.state.curve_answers = TTLCache[str, bytes](ANSWER_SECONDS, max_size=ANSWERS)
    app.state.prices = PriceTable(settings.prices)
    app.state.secret_box = secret_box(settings)
    app.state.job_tokens = JobTokens.of(settings)
    app.state.storage = storage_of(settings)
    app.state.waits = Waits(settings.team_max_waiting)
    app.state.spools = spool_places(settings)
    app.state.streams = Places(
        "metric streams open",
        Limit(settings.team_max_streams, "OPD_TEAM_MAX_STREAMS"),
        Limit(settings.max_streams, "OPD_MAX_STREAMS"),
    )
    app.add_middleware(
        BodyLimitMiddleware, max_bytes=settings.max_body_bytes, streamed=STREAMED_BODIES
    )
    app.add_middleware(RequestMetricsMiddleware)
    install_error_handlers(app)
    app.include_router(api_router)
    install_dashboard(app, settings)
    return app
