"""The audit log as the API shows it, and the actions it records (one name per act, the
same the CLI and the SDK use: `job.create` is `opd jobs create` and `jobs.create`)."""

import re
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from app.core.pages import Page

ACTIONS = (
    "job.create",
    "job.cancel",
    "job.pause",
    "job.resume",
    "sweep.create",
    "sweep.cancel",
    "webhook.create",
    "webhook.delete",
    "webhook.resend",
    "key.create",
    "key.revoke",
    "team.limits",
)
"""Every action an entry records, besides a change refused for its scope, which is recorded
as its request (`POST /v1/jobs`)."""
OLD_ACTIONS = {"job.submit": "job.create"}
"""Names of earlier releases, still accepted as a filter for one release."""
REFUSED = re.compile(r"(POST|PUT|PATCH|DELETE) /\S*")
"""A refused change's action: its method and route."""


class UnknownAction(ValueError):
    """An action filter naming no action the log records."""

    def __init__(self, action: str) -> None:
        super().__init__(
            f"no audit action {action!r}; the actions are {', '.join(ACTIONS)} "
            "(and, for a change refused for its scope, its request, e.g. 'POST /v1/jobs')"
        )


def known_action(action: str) -> str:
    """The action as the log records it (an old name read as its new one), or UnknownAction."""
    action = OLD_ACTIONS.get(action, action)
    if action in ACTIONS or REFUSED.fullmatch(action):
        return action
    raise UnknownAction(action)


class AuditEntryPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    created_at: datetime
    key_prefix: str | None = Field(description="The key's public prefix; null: the command line.")
    team_id: int | None = Field(description="The key's team.")
    team: str | None = Field(None, description="The key's team by name, as usage names it.")
    action: str = Field(description="e.g. `job.create`, `job.cancel`, `webhook.create`.")
    target: str | None = Field(description="What it acted on, e.g. `job 12`.")
    status_code: int = Field(description="The HTTP status the request was answered with.")
    detail: dict[str, Any] | None


class AuditPage(Page[AuditEntryPublic]):
    """Newest first; pass `next_cursor` as `after` to get the next page."""
