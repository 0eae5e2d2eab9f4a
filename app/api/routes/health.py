"""Liveness (the process answers) and readiness (the database and Redis answer)."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from pydantic import BaseModel
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError

from app.api.deps import QueueDep, SettingsDep
from app.api.errors import ApiError, error_responses
from app.core.queue import QueueUnavailable

router = APIRouter(tags=["health"])


class Health(BaseModel):
    status: str


@router.get("/healthz", response_model=Health)
async def healthz() -> Health:
    return Health(status="ok")


@router.get("/readyz", response_model=Health, responses=error_responses(503))
async def readyz(request: Request, queue: QueueDep, settings: SettingsDep) -> Health:
    """Ready when the database and Redis both answer within OPD_CONNECT_TIMEOUT seconds."""
    problems = []
    try:
        async with request.app.state.sessions() as session:
            await asyncio.wait_for(session.execute(text("SELECT 1")), settings.connect_timeout)
    except (SQLAlchemyError, OSError, TimeoutError) as error:
        first_line = str(error).splitlines()[0] if str(error) else type(error).__name__
        problems.append(f"database: {first_line}")
    try:
        await queue.ping()
    except QueueUnavailable as error:
        problems.append(str(error))
    if problems:
        raise ApiError(503, "not_ready", "; ".join(problems))
    return Health(status="ready")
