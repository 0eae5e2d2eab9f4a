"""Token usage of a team (or, for an admin, of any team or all), by job or by day."""

from __future__ import annotations

import re
from datetime import date, timedelta
from typing import Annotated

from fastapi import APIRouter, Query
from pydantic import BeforeValidator
from sqlalchemy import select

from app.api.deps import PricesDep, PrincipalDep, SessionDep
from app.api.errors import ApiError, error_responses
from app.auth.tables import Team
from app.core.tables import utcnow
from app.usage.report import summarize, total_of
from app.usage.schemas import GroupBy, UsageReport
from app.usage.store import usage_rows

router = APIRouter(prefix="/v1/usage", tags=["usage"], responses=error_responses(401, 403, 422))

DEFAULT_SPAN = timedelta(days=29)
"""`since` when only `until` is given: 30 days up to it."""
ISO_DAY = re.compile(r"\d{4}-\d{2}-\d{2}")


def iso_day(value: object) -> object:
    """A day written as the schema says (`YYYY-MM-DD`): pydantic alone also reads a number
    as seconds since 1970 (`from=0` was 1970-01-01)."""
    if isinstance(value, str) and not ISO_DAY.fullmatch(value):
        raise ValueError("a day is written YYYY-MM-DD")
    return value


Day = Annotated[date, BeforeValidator(iso_day)]


@router.get("", response_model=UsageReport, responses=error_responses(404))
async def read_usage(
    session: SessionDep,
    principal: PrincipalDep,
    prices: PricesDep,
    since: Annotated[
        Day | None, Query(description="First UTC day; default 30 days before `until`.")
    ] = None,
    until: Annotated[
        Day | None,
        Query(description="Last UTC day; default today. Before `since`: no days."),
    ] = None,
    old_from: Annotated[
        Day | None,
        Query(
            alias="from",
            deprecated=True,
            description="The old name of `since` (given both, `since` counts).",
        ),
    ] = None,
    old_to: Annotated[
        Day | None,
        Query(
            alias="to",
            deprecated=True,
            description="The old name of `until` (given both, `until` counts).",
        ),
    ] = None,
    group_by: Annotated[GroupBy, Query(description="One row per job, or per day.")] = GroupBy.job,
    team: Annotated[
        str | None,
        Query(max_length=200, description="Admin keys: one team (default: every team)."),
    ] = None,
) -> UsageReport:
    """Sampled, teacher-scored, trained and eval tokens per job or per day, with an
    estimated cost when the service has a price table. The caller's team; an admin key
    may ask for any team, or get every team's rows (each names its team)."""
    last = until or old_to or utcnow().date()
    first = since or old_from or max(date.min + DEFAULT_SPAN, last) - DEFAULT_SPAN
    team_id, team = await team_asked(session, principal, team)
    rows = summarize(await usage_rows(session, team_id, first, last), group_by, prices)
    return UsageReport(
        since=first,
        until=last,
        from_=first,
        to=last,
        group_by=group_by,
        team=team,
        priced=bool(prices),
        rows=rows,
        total=total_of(rows),
    )


async def team_asked(
    session: SessionDep, principal: PrincipalDep, name: str | None
) -> tuple[int | None, str | None]:
    """The id and name of the team whose usage is read: the caller's own unless an admin
    names one ((None, None): every team, for an admin who names none)."""
    if not principal.is_admin:
        own = (
            await session.execute(select(Team.name).where(Team.id == principal.team_id))
        ).scalar_one()
        if name not in (None, own):
            raise ApiError(
                403, "forbidden", "another team's usage needs a key with the 'admin' scope"
            )
        return principal.team_id, own
    if name is None:
        return None, None
    team_id = (await session.execute(select(Team.id).where(Team.name == name))).scalar_one_or_none()
    if team_id is None:
        raise ApiError(404, "not_found", f"no team named {name!r}", "team")
    return team_id, name
