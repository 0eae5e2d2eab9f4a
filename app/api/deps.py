"""Typed dependencies: the database session, the job queue, settings and the caller."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Path, Query, Request
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.ext.asyncio import AsyncSession

from app.api.errors import ApiError
from app.auth import Principal, authenticate
from app.core.cache import TTLCache
from app.core.config import Settings
from app.models import Job
from app.queue import JobQueue
from app.sessions import session_principal
from app.store.rows import get_job


@dataclass(frozen=True)
class JobSnapshot:
    """A job's public JSON as read at one moment, with the team that owns it."""

    team_id: int
    body: bytes


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


SessionDep = Annotated[AsyncSession, Depends(get_session)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
QueueDep = Annotated[JobQueue, Depends(get_queue)]
SnapshotsDep = Annotated[TTLCache[int, JobSnapshot], Depends(get_snapshots)]


READ_METHODS = frozenset({"GET", "HEAD"})


def unauthorized(message: str) -> ApiError:
    return ApiError(401, "unauthorized", message, headers={"WWW-Authenticate": "Bearer"})


async def get_principal(
    request: Request,
    session: SessionDep,
    bearer: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer_scheme)],
    api_key: Annotated[str | None, Depends(api_key_scheme)],
) -> Principal:
    key = bearer.credentials if bearer is not None else api_key
    if not key and request.method in READ_METHODS:
        # The dashboard's charts read these endpoints with its session cookie (reads only:
        # a cookie never authorises a change here, so no CSRF token is needed).
        principal = await session_principal(request, session, time.time())
        if principal is not None:
            return principal
    if not key:
        raise unauthorized("missing API key: send 'Authorization: Bearer KEY' or 'X-API-Key: KEY'")
    principal = await authenticate(session, key, request.app.state.principals)
    if principal is None:
        raise unauthorized("unknown or revoked API key")
    return principal


PrincipalDep = Annotated[Principal, Depends(get_principal)]
MAX_ID = 2**31 - 1
"""The largest id or step an INTEGER column holds on every database; larger is a 422."""
JobId = Annotated[int, Path(ge=1, le=MAX_ID, description="The job's id.")]
Cursor = Annotated[
    int | None, Query(ge=1, le=MAX_ID, description="`next_cursor` of the last page.")
]


async def get_visible_job(job_id: JobId, session: SessionDep, principal: PrincipalDep) -> Job:
    """The job, if the caller's team owns it (any job for an admin key); else 404."""
    return await get_job(session, job_id, principal.scope)


JobDep = Annotated[Job, Depends(get_visible_job)]
