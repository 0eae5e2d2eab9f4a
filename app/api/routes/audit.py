"""The audit log of state-changing requests: a team's keys read their team's entries (a
`read` key too: it is what the team did, not a secret), admin keys every team's."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from sqlalchemy import select

from app.api.deps import Cursor, PrincipalDep, SessionDep
from app.api.errors import ApiError, error_responses
from app.api.pagination import paginate
from app.audit.schemas import AuditPage, UnknownAction, known_action
from app.audit.store import audit_query
from app.auth.tables import Team

router = APIRouter(prefix="/v1/audit", tags=["audit"], responses=error_responses(401, 403, 422))
MAX_PAGE = 200


@router.get("", response_model=AuditPage)
async def read_audit(
    session: SessionDep,
    principal: PrincipalDep,
    after: Cursor = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50,
    action: Annotated[
        str | None,
        Query(
            max_length=64,
            description="e.g. job.cancel; an action the log does not record is a 422 that "
            "lists those it does (job.submit, the old name of job.create, still matches).",
        ),
    ] = None,
) -> AuditPage:
    """Newest first: who (key prefix, team) did what (action, target) and how it went."""
    try:
        action = None if action is None else known_action(action)
    except UnknownAction as error:
        raise ApiError(422, "invalid_request", str(error), "action") from None
    page = await paginate(session, audit_query(principal.scope, after, action), limit, AuditPage)
    team_ids = {entry.team_id for entry in page.data if entry.team_id is not None}
    if team_ids:
        rows = await session.execute(select(Team.id, Team.name).where(Team.id.in_(team_ids)))
        names = dict(rows.tuples().all())
        for entry in page.data:
            entry.team = names.get(entry.team_id) if entry.team_id is not None else None
    return page
