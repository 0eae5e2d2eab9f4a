"""The usage page: the team's spend this period, per UTC day, against its budget (and the
soft-threshold banner other pages show too)."""

from __future__ import annotations

from datetime import timedelta

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
from app.usage.report import summarize, total_of
from app.usage.schemas import GroupBy
from app.usage.store import usage_rows
from app.web.deps import ViewerDep
from app.web.templating import render

router = APIRouter(prefix="/ui", include_in_schema=False)

MAX_TEAMS_SHOWN = 100
RECENT_DAYS = timedelta(days=29)
"""The usage table's days before today: 30 in all, as `GET /v1/usage` gives by default."""


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
    """Spend so far this period, per day, against the budget; and, budget or not, the
    tokens used per day over the last 30 days (what `opd usage --group-by day` shows)."""
    budgets = await budgets_seen(session, viewer, prices)
    last = utcnow().date()
    rows = await usage_rows(session, viewer.scope, last - RECENT_DAYS, last)
    days = summarize(rows, GroupBy.day, prices)
    context = {
        "viewer": viewer,
        "budgets": budgets,
        "budget_banner": next((b for b in budgets if b.state != "ok"), None),
        "days": days,
        "total": total_of(days),
        "priced": bool(prices),
    }
    return render(request, "usage.html", context)
