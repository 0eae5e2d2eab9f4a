"""The audit log: every state-changing request, with the key's prefix and team, the action,
its target and the answer; read newest first, per team or (admin) for every team.

An action and its row commit together or not at all: the store call that makes the action
is given `commit=False` (it only flushes), and `record_audit` commits both.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from app.audit.tables import AuditEntry
from app.core.tables import utcnow

if TYPE_CHECKING:
    from app.auth.keys import Principal


async def record_audit(
    session: AsyncSession,
    principal: Principal | None,
    action: str,
    target: str | None,
    status_code: int,
    detail: dict[str, Any] | None = None,
) -> None:
    """Append one entry and commit it with what the session holds (the action it records,
    made with `commit=False`); `principal` None is the operator's command line."""
    session.add(
        AuditEntry(
            created_at=utcnow(),
            key_prefix=principal.key_prefix if principal else None,
            team_id=principal.team_id if principal else None,
            action=action,
            target=target,
            status_code=status_code,
            detail=detail,
        )
    )
    await session.commit()


def audit_query(team_id: int | None, after: int | None, action: str | None) -> Any:
    """Entries newest first: one team's (None: every team's), before the cursor `after`."""
    query = select(AuditEntry).order_by(AuditEntry.id.desc())
    if team_id is not None:
        query = query.where(AuditEntry.team_id == team_id)
    if after is not None:
        query = query.where(AuditEntry.id < after)
    if action is not None:
        query = query.where(AuditEntry.action == action)
    return query
