"""What the stored completions refuse, each its own answer at the doors."""

from __future__ import annotations


class StoredCompletionNotFound(LookupError):
    """No stored completion with this id (or one of another team: the answer is the same)."""


class StoredQuotaExceeded(Exception):
    """The team keeps as many stored completions as it may (a 429 that says so)."""

    def __init__(self, quota: int) -> None:
        super().__init__(
            f"the team keeps {quota} stored completions, its quota "
            "(OPD_TEAM_MAX_STORED_COMPLETIONS): delete those it no longer needs "
            "(DELETE /v1/chat/completions/{id}) or send the request without store"
        )
