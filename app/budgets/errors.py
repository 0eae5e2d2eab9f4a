"""What a door answers when a team's budget stops it."""

from __future__ import annotations

from datetime import datetime

from app.budgets.rules import Limit, Spend, exceeded_message


class BudgetExceeded(Exception):
    """The team reached its hard limit this period, or a request's most does not fit what
    is left (`why` says so): nothing more may start (a 429)."""

    def __init__(
        self, team: str, limit: Limit, spend: Spend, ends: datetime, why: str | None = None
    ) -> None:
        super().__init__(why or exceeded_message(team, limit, spend, ends))
        self.team, self.limit, self.spend, self.ends = team, limit, spend, ends

    def retry_after(self, now: datetime) -> int:
        """Seconds until the period ends (a 429's Retry-After)."""
        return max(int((self.ends - now).total_seconds()) + 1, 1)


class BudgetRefused(ValueError):
    """A budget or a spec the budget cannot bound (a cost budget without prices); the
    message says why, `param` names the field."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param
