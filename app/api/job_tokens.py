"""The API's side of job tokens (app/auth/job_tokens.py): a worker scoring for a job
through this service's own `/v1/completions` acts as that job's team, on that route only,
while the job runs."""

from __future__ import annotations

import time

from fastapi import Request
from sqlalchemy.ext.asyncio import AsyncSession
from sqlmodel import select

from app.api.errors import ApiError
from app.auth.keys import Principal
from app.auth.schemas import Scope
from app.auth.tables import Team
from app.jobs.schemas import ACTIVE_STATUSES
from app.jobs.tables import Job

ACCEPTED_ON = ("POST", "/v1/completions")
"""The one route a job token opens: what a teacher server's client calls."""


def unauthorized(message: str) -> ApiError:
    return ApiError(401, "unauthorized", message, headers={"WWW-Authenticate": "Bearer"})


async def job_principal(request: Request, session: AsyncSession, token: str) -> Principal:
    """The job's team, for a genuine unexpired token on POST /v1/completions of a job that
    runs (401 for a forged, expired or ended one; 403 on any other route); never admin."""
    claims = request.app.state.job_tokens.read(token, time.time())
    if claims is None:
        raise unauthorized("unknown or expired job token")
    route = getattr(request.scope.get("route"), "path", request.url.path)
    if (request.method, route) != ACCEPTED_ON:
        raise ApiError(
            403, "forbidden", f"a job token is accepted by {' '.join(ACCEPTED_ON)} only, not here"
        )
    team = (
        await session.execute(
            select(Team.name)
            .join(Job, Job.team_id == Team.id)
            .where(
                Job.id == claims.job_id,
                Job.team_id == claims.team_id,
                Job.status.in_(ACTIVE_STATUSES),
            )
        )
    ).scalar_one_or_none()
    if team is None:
        raise unauthorized("the job token's job is not running")
    return Principal(
        claims.team_id, Scope.submit, f"job-{claims.job_id}", team_name=team, job_id=claims.job_id
    )
