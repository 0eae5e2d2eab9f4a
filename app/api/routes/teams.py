"""Teams and their limits (admin keys): how many jobs each may run and keep queued."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path

from app.api.deps import PrincipalDep, SessionDep, SettingsDep, needs
from app.api.errors import error_responses
from app.audit.store import record_audit
from app.auth.schemas import Scope
from app.jobs.limits import Limits
from app.teams.schemas import LimitsUpdate, TeamPublic, TeamsList
from app.teams.store import list_teams, set_limits

router = APIRouter(
    prefix="/v1/teams",
    tags=["teams"],
    responses=error_responses(400, 401, 403, 413, 415, 422, 503),
)
ADMIN = needs(Scope.admin)
TeamName = Annotated[str, Path(min_length=1, max_length=200, description="The team's name.")]


@router.get("", response_model=TeamsList, openapi_extra=ADMIN)
async def read_teams(
    session: SessionDep, principal: PrincipalDep, settings: SettingsDep
) -> TeamsList:
    """Every team with its limits and its jobs running and queued."""
    teams = await list_teams(session, Limits.of(settings))
    return TeamsList(data=[TeamPublic.model_validate(team) for team in teams])


@router.patch(
    "/{name}", response_model=TeamPublic, openapi_extra=ADMIN, responses=error_responses(404)
)
async def update_team(
    name: TeamName,
    update: LimitsUpdate,
    session: SessionDep,
    principal: PrincipalDep,
    settings: SettingsDep,
) -> TeamPublic:
    """Set a team's running and queued limits (null: back to the service's default)."""
    changes = update.model_dump(exclude_unset=True)
    team = await set_limits(session, name, changes, Limits.of(settings), commit=False)
    await record_audit(session, principal, "team.limits", f"team {name}", 200, changes)
    return TeamPublic.model_validate(team)
