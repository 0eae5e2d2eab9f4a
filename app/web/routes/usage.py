"""The usage page: the team's spend this period, per UTC day, against its budget (and the
soft-threshold banner other pages show too)."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from app.api.deps import PricesDep, SessionDep
from app.auth.keys import Principal
from app.budgets.schemas import BudgetPublic
from app.budgets.service import budget_public
from app.budgets.tables import TeamBudget
from app.core.pricing import PriceTable
from app.core.tables import utcnow
from app.web.deps import ViewerDep
from app.web.templating import render

router = APIRouter(prefix="/ui", include_in_schema=False)

MAX_TEAMS_SHOWN = 100


async def budgets_seen(
    session: AsyncSession, viewer: Principal, prices: PriceTable
) -> list[BudgetPublic]:
    """The viewer's team's budget, or (an admin) every team's that has one."""
    if not viewer.is_admin:
        own = await budget_public(session, viewer.team_id, prices, utcnow())
        return [] if own is None else [own]
    teams = await session.execute(
        select(TeamBudget.team_id).order_by(TeamBudget.team_id).limit(MAX_TEAMS_SHOWN)
    )
    found = [await budget_public(session, team, prices, utcnow()) for team in teams.scalars()]
    return [budget for budget in found if budget is not None]


async def budget_banner(
    session: AsyncSession, viewer: Principal, prices: PriceTable
) -> BudgetPublic | None:
    """The team's budget when a banner should say so: past its soft threshold."""
    if viewer.is_admin:
        return None
    budget = await budget_public(session, viewer.team_id, prices, utcnow())
    return budget if budget is not None and budget.state != "ok" else None


@router.get("/usage")
async def usage_page(
    request: Request, session: SessionDep, viewer: ViewerDep, prices: PricesDep
) -> Response:
    """Spend so far this period, per day, against the budget."""
    budgets = await budgets_seen(session, viewer, prices)
    context = {
        "viewer": viewer,
        "budgets": budgets,
        "budget_banner": next((b for b in budgets if b.state != "ok"), None),
    }
    return render(request, "usage.html", context)
