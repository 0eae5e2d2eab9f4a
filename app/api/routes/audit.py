"""The audit log of state-changing requests: a team's keys read their team's entries (needs
the `submit` scope), admin keys every team's."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from app.api.deps import Cursor, PrincipalDep, SessionDep, needs
from app.api.errors import error_responses
from app.api.pagination import paginate
from app.audit.schemas import AuditPage
from app.audit.store import audit_query
from app.auth.schemas import Scope

router = APIRouter(prefix="/v1/audit", tags=["audit"], responses=error_responses(401, 403, 422))
MAX_PAGE = 200


@router.get("", response_model=AuditPage, openapi_extra=needs(Scope.submit))
async def read_audit(
    session: SessionDep,
    principal: PrincipalDep,
    after: Cursor = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50,
    action: Annotated[str | None, Query(max_length=64, description="e.g. job.cancel")] = None,
) -> AuditPage:
    """Newest first: who (key prefix, team) did what (action, target) and how it went."""
    return await paginate(session, audit_query(principal.scope, after, action), limit, AuditPage)
