"""Teams and their limits (admin keys): how many jobs each may run and keep queued, and
what each may spend a period (its budget)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Response
from sqlalchemy.ext.asyncio import AsyncSession

from app.api.deps import PricesDep, PrincipalDep, QueueDep, SessionDep, SettingsDep, needs
from app.api.errors import ApiError, error_responses
from app.audit.store import record_audit
from app.auth.schemas import Scope
from app.budgets.errors import BudgetRefused
from app.budgets.schemas import BudgetPublic, BudgetUpdate
from app.budgets.service import budget_public, remove_budget, set_budget
from app.budgets.store import team_named
from app.core.tables import utcnow
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


BUDGET_RESPONSES = error_responses(404)
TeamRef = Annotated[
    str, Path(min_length=1, max_length=200, description="The team's name, or its id.")
]


async def team_of(session: AsyncSession, ref: str) -> tuple[int, str]:
    """The id and name of the team `ref` names (by name or id); a 404 naming `team`."""
    team = await team_named(session, ref)
    if team is None or team.id is None:
        raise ApiError(404, "not_found", f"no team named {ref!r}", "team")
    return team.id, team.name


@router.get(
    "/{team}/budget", response_model=BudgetPublic, openapi_extra=ADMIN, responses=BUDGET_RESPONSES
)
async def read_budget(
    team: TeamRef, session: SessionDep, principal: PrincipalDep, prices: PricesDep
) -> BudgetPublic:
    """The team's budget with its spend this period, per UTC day; 404 without one."""
    team_id, name = await team_of(session, team)
    budget = await budget_public(session, team_id, prices, utcnow())
    if budget is None:
        raise ApiError(404, "not_found", f"team {name!r} has no budget", "team")
    return budget


@router.put(
    "/{team}/budget", response_model=BudgetPublic, openapi_extra=ADMIN, responses=BUDGET_RESPONSES
)
async def put_team_budget(
    team: TeamRef,
    update: BudgetUpdate,
    session: SessionDep,
    principal: PrincipalDep,
    prices: PricesDep,
    queue: QueueDep,
) -> BudgetPublic:
    """Set what the team may spend a period: `{"tokens": N}` (every token its jobs and
    completions sample, score, train and evaluate, as `GET /v1/usage` counts them) or
    `{"cost": X}` (priced by OPD_PRICES; a spec the table cannot price is then refused),
    with `soft` (default 0.8) and `period` (`month` by default: UTC calendar months).

    Past `soft`, the team's webhooks get one `budget.threshold` event a period and the
    dashboard shows a banner. At the limit, `POST /v1/jobs` (and clones, sweeps, the
    playground and completions) answer 429 `budget_exceeded` with what was spent, the
    budget and when the period ends; the team's running jobs pause at their next step
    boundary (`stop_reason: budget`, rows and checkpoints intact) and its queued jobs
    pause too. They resume by themselves when the budget is raised (here) or the period
    turns. The team spends at most its limit plus one step per running job."""
    team_id, name = await team_of(session, team)
    try:
        budget = await set_budget(session, queue, team_id, update, prices, utcnow())
    except BudgetRefused as refused:
        raise ApiError(422, "invalid_request", str(refused), refused.param) from None
    detail = update.model_dump(mode="json")
    await record_audit(session, principal, "team.budget", f"team {name}", 200, detail)
    return budget


@router.delete("/{team}/budget", status_code=204, openapi_extra=ADMIN, responses=BUDGET_RESPONSES)
async def delete_team_budget(
    team: TeamRef,
    session: SessionDep,
    principal: PrincipalDep,
    prices: PricesDep,
    queue: QueueDep,
) -> Response:
    """Remove the team's budget: nothing limits its spending, and what it paused resumes."""
    team_id, name = await team_of(session, team)
    if not await remove_budget(session, queue, team_id, prices, utcnow()):
        raise ApiError(404, "not_found", f"team {name!r} has no budget", "team")
    await record_audit(session, principal, "team.budget", f"team {name}", 204, None)
    return Response(status_code=204)
