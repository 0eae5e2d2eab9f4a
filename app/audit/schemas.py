"""The audit log as the API shows it."""

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from app.core.pages import Page


class AuditEntryPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    created_at: datetime
    key_prefix: str | None = Field(description="The key's public prefix; null: the command line.")
    team_id: int | None = Field(description="The key's team.")
    action: str = Field(description="e.g. `job.submit`, `job.cancel`, `webhook.create`.")
    target: str | None = Field(description="What it acted on, e.g. `job 12`.")
    status_code: int = Field(description="The HTTP status the request was answered with.")
    detail: dict[str, Any] | None


class AuditPage(Page[AuditEntryPublic]):
    """Newest first; pass `next_cursor` as `after` to get the next page."""
