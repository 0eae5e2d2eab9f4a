"""What a team and its admins manage: usage, the audit log, keys, teams' limits and budgets."""

from __future__ import annotations

from datetime import date
from typing import (
    Any,
    Literal,
)

from app.audit.schemas import AuditEntryPublic, AuditPage
from app.auth.schemas import KeyCreated, KeyPublic, KeysList, Scope
from app.budgets.schemas import BudgetPublic
from app.teams.schemas import TeamPublic, TeamsList
from app.usage.schemas import GroupBy, UsageReport
from opd.sdk.resources.base import UNSET, Resource, X, listed, operation, query, renamed
from opd.sdk.transport import Call, Listing, Steps, fetch


class Usage(Resource[X]):
    def get(
        self,
        *,
        since: date | None = None,
        until: date | None = None,
        group_by: GroupBy | Literal["job", "day"] = GroupBy.job,
        team: str | None = None,
        first: date | None = None,
        last: date | None = None,
    ) -> Any:
        """Tokens per job or per day from `since` to `until` (UTC days; default the last
        30) with estimated costs; `team`: admin keys only. (`first` and `last` are the old
        names of `since` and `until`, kept for one release.)"""
        if first is not None:
            renamed("usage.get(first=)", "usage.get(since=)")
        if last is not None:
            renamed("usage.get(last=)", "usage.get(until=)")
        return self._report(since or first, until or last, group_by, team)

    @operation
    def _report(
        self,
        since: date | None,
        until: date | None,
        group_by: GroupBy | Literal["job", "day"],
        team: str | None,
    ) -> Steps[UsageReport]:
        params = query(
            since=since and since.isoformat(),
            until=until and until.isoformat(),
            group_by=group_by,
            team=team,
        )
        return (yield from fetch(Call("GET", "/v1/usage", params=params), UsageReport))


class Audit(Resource[X]):
    @listed(AuditEntryPublic)
    def list(self, *, action: str | None = None, page_size: int = 100) -> Listing:
        """State-changing requests, newest first (e.g. `action="job.cancel"`)."""
        params = query(action=action, limit=page_size)
        return Listing(Call("GET", "/v1/audit", params=params), AuditPage)


class Keys(Resource[X]):
    """API keys (admin keys only)."""

    @operation
    def list(self) -> Steps[list[KeyPublic]]:
        return (yield from fetch(Call("GET", "/v1/keys"), KeysList)).data

    @operation
    def create(
        self, team: str, *, scope: Scope | str = Scope.submit, expires_in_days: int | None = None
    ) -> Steps[KeyCreated]:
        """A key for `team` (created if new); `.key` is the only copy of the secret."""
        body = query(team=team, scope=scope, expires_in_days=expires_in_days)
        return (yield from fetch(Call("POST", "/v1/keys", json=body, resendable=False), KeyCreated))

    @operation
    def revoke(self, prefix: str) -> Steps[None]:
        yield Call("DELETE", f"/v1/keys/{prefix}")


class Teams(Resource[X]):
    """Teams, their limits and budgets (admin keys only)."""

    @operation
    def list(self) -> Steps[list[TeamPublic]]:
        return (yield from fetch(Call("GET", "/v1/teams"), TeamsList)).data

    @operation
    def update(
        self, name: str, *, max_running: int | None = UNSET, max_queued: int | None = UNSET
    ) -> Steps[TeamPublic]:
        """Set the limits given; None puts one back to the service's default."""
        body = {
            field: value
            for field, value in (("max_running", max_running), ("max_queued", max_queued))
            if value is not UNSET
        }
        return (yield from fetch(Call("PATCH", f"/v1/teams/{name}", json=body), TeamPublic))

    @operation
    def budget(self, team: str) -> Steps[BudgetPublic]:
        """The team's budget (by name or id) and its spend this period, per day."""
        return (yield from fetch(Call("GET", f"/v1/teams/{team}/budget"), BudgetPublic))

    @operation
    def set_budget(
        self,
        team: str,
        *,
        tokens: int | None = None,
        cost: float | None = None,
        soft: float = 0.8,
        period: str = "month",
    ) -> Steps[BudgetPublic]:
        """Set what the team may spend a period: `tokens` or `cost` (one of them)."""
        body = {"tokens": tokens, "cost": cost, "soft": soft, "period": period}
        body = {field: value for field, value in body.items() if value is not None}
        call = Call("PUT", f"/v1/teams/{team}/budget", json=body)
        return (yield from fetch(call, BudgetPublic))

    @operation
    def delete_budget(self, team: str) -> Steps[None]:
        """Remove the team's budget (what it paused resumes)."""
        yield Call("DELETE", f"/v1/teams/{team}/budget")
