"""Typed dependencies: the database session, the job queue, settings and the caller."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, Path, Query, Request
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.ext.asyncio import AsyncSession
from starlette.routing import BaseRoute

from app.api.errors import ApiError
from app.api.job_tokens import job_principal, unauthorized
from app.audit.store import record_audit
from app.auth.job_tokens import is_job_token
from app.auth.keys import Principal, authenticate
from app.auth.schemas import Scope
from app.auth.sessions import session_principal
from app.core.cache import TTLCache
from app.core.config import Settings
from app.core.encryption import SecretBox
from app.core.pricing import PriceTable
from app.core.queue import JobQueue
from app.core.tables import utcnow
from app.core.waits import Places, Waits
from app.jobs.rows import get_job
from app.jobs.tables import Job
from kernel.storage.blobs import Storage


@dataclass(frozen=True)
class JobSnapshot:
    """A job's public JSON as read at one moment, with the team that owns it: `body` as an
    admin key sees it, `team_body` as the team's keys do (no worker folder,
    app/jobs/visibility.py)."""

    team_id: int
    body: bytes
    team_body: bytes


bearer_scheme = HTTPBearer(auto_error=False, description="Authorization: Bearer KEY")
api_key_scheme = APIKeyHeader(name="X-API-Key", auto_error=False, description="X-API-Key: KEY")


async def get_session(request: Request) -> AsyncIterator[AsyncSession]:
    async with request.app.state.sessions() as session:
        yield session


def get_settings(request: Request) -> Settings:
    return request.app.state.settings


def get_queue(request: Request) -> JobQueue:
    return request.app.state.queue


def get_snapshots(request: Request) -> TTLCache[int, JobSnapshot]:
    return request.app.state.snapshots


def get_prices(request: Request) -> PriceTable:
    return request.app.state.prices


def get_secret_box(request: Request) -> SecretBox:
    return request.app.state.secret_box


def get_waits(request: Request) -> Waits:
    return request.app.state.waits


def get_streams(request: Request) -> Places:
    return request.app.state.streams


def get_spools(request: Request) -> Places:
    """The bytes of uploads arriving in this process, per team (app/files/service.py)."""
    return request.app.state.spools


def get_storage(request: Request) -> Storage:
    return request.app.state.storage


SessionDep = Annotated[AsyncSession, Depends(get_session)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
QueueDep = Annotated[JobQueue, Depends(get_queue)]
SnapshotsDep = Annotated[TTLCache[int, JobSnapshot], Depends(get_snapshots)]
PricesDep = Annotated[PriceTable, Depends(get_prices)]
SecretBoxDep = Annotated[SecretBox, Depends(get_secret_box)]
WaitsDep = Annotated[Waits, Depends(get_waits)]
StreamsDep = Annotated[Places, Depends(get_streams)]
SpoolsDep = Annotated[Places, Depends(get_spools)]
StorageDep = Annotated[Storage, Depends(get_storage)]


READ_METHODS = frozenset({"GET", "HEAD"})
SCOPE_EXTENSION = "x-opd-scope"
"""The OpenAPI extension naming the scope a route needs (routes/...: `needs(Scope.admin)`)."""


def needs(scope: Scope) -> dict[str, Any]:
    """`openapi_extra` of a route that needs more than its method's default scope."""
    return {SCOPE_EXTENSION: scope.value}


def default_scope(method: str) -> Scope:
    """Reads need `read`; every change needs `submit` unless the route says more."""
    return Scope.read if method in READ_METHODS else Scope.submit


def uses_principal(dependant: Dependant) -> bool:
    return any(
        dependency.call is get_principal or uses_principal(dependency)
        for dependency in dependant.dependencies
    )


def document_scopes(routes: Sequence[BaseRoute]) -> None:
    """Write in the OpenAPI entry of every operation that takes a key the scope it needs
    (its own `needs(...)`, else its method's default): the document tells clients, and
    `required_scope` reads the same entry."""
    for route in routes:
        if isinstance(route, APIRoute) and uses_principal(route.dependant):
            (method,) = route.methods
            scope = (route.openapi_extra or {}).get(SCOPE_EXTENSION) or default_scope(method)
            route.openapi_extra = {**(route.openapi_extra or {}), SCOPE_EXTENSION: scope}


def required_scope(request: Request) -> Scope:
    route = request.scope.get("route")
    declared = getattr(route, "openapi_extra", None) or {}
    return Scope(declared.get(SCOPE_EXTENSION) or default_scope(request.method))


async def refuse(
    request: Request, session: AsyncSession, principal: Principal, needed: Scope
) -> ApiError:
    """A 403 naming the scope the request needs; a refused change is audited."""
    route = request.scope.get("route")
    action = f"{request.method} {getattr(route, 'path', request.url.path)}"
    if request.method not in READ_METHODS:
        await record_audit(session, principal, action, request.url.path, 403)
    return ApiError(
        403,
        "forbidden",
        f"{action} needs a key with the {needed.value!r} scope; this key's scope is "
        f"{principal.key_scope.value!r}",
    )


async def get_principal(
    request: Request,
    session: SessionDep,
    bearer: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer_scheme)],
    api_key: Annotated[str | None, Depends(api_key_scheme)],
) -> Principal:
    """The caller, once its key is known, unexpired and allowed this route (else 401/403)."""
    principal = await identify(request, session, bearer.credentials if bearer else api_key)
    if principal.expired(utcnow()):
        assert principal.expires_at is not None
        expired = principal.expires_at.isoformat(timespec="seconds")
        raise unauthorized(f"the API key expired at {expired}; ask an admin for a new one")
    needed = required_scope(request)
    if not principal.allows(needed):
        raise await refuse(request, session, principal, needed)
    return principal


async def identify(request: Request, session: AsyncSession, key: str | None) -> Principal:
    if not key and request.method in READ_METHODS:
        # The dashboard's charts read these endpoints with its session cookie (reads only:
        # a cookie never authorises a change here, so no CSRF token is needed).
        principal = await session_principal(request, session, time.time())
        if principal is not None:
            return principal
    if not key:
        raise unauthorized("missing API key: send 'Authorization: Bearer KEY' or 'X-API-Key: KEY'")
    if is_job_token(key):  # a worker scoring for a job through this service's own /v1
        return await job_principal(request, session, key)
    principal = await authenticate(session, key, request.app.state.principals)
    if principal is None:
        raise unauthorized("unknown or revoked API key")
    return principal


PrincipalDep = Annotated[Principal, Depends(get_principal)]


def one_value_each(request: Request) -> None:
    """A query parameter given twice is a 422: each takes one value, as the document says
    (keeping the last one silently would hide the client's mistake)."""
    seen: set[str] = set()
    for name, _ in request.query_params.multi_items():
        if name in seen:
            raise ApiError(422, "invalid_request", f"{name}: give it once", name)
        seen.add(name)


MAX_ID = 2**31 - 1
"""The largest id or step an INTEGER column holds on every database; larger is a 422."""
JobId = Annotated[int, Path(ge=1, le=MAX_ID, description="The job's id.")]
SweepId = Annotated[int, Path(ge=1, le=2**31 - 1, description="The sweep's id.")]
Cursor = Annotated[
    int | None, Query(ge=1, le=MAX_ID, description="`next_cursor` of the last page.")
]


async def get_visible_job(job_id: JobId, session: SessionDep, principal: PrincipalDep) -> Job:
    """The job, if the caller's team owns it (any job for an admin key); else 404."""
    return await get_job(session, job_id, principal.scope)


JobDep = Annotated[Job, Depends(get_visible_job)]
