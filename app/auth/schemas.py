"""Teams and API keys as the API shows them, and what a key may do."""

from datetime import datetime
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from kernel.json_types import JsonModel


class Scope(StrEnum):
    """What a key may do, each including the one before: `read` (GET only), `submit` (create
    and act on its team's jobs and webhooks), `admin` (every team, keys, teams' limits)."""

    read = "read"
    submit = "submit"
    admin = "admin"

    def allows(self, needed: "Scope") -> bool:
        order = list(Scope)
        return order.index(self) >= order.index(needed)


MAX_KEY_DAYS = 3660


class KeyPublic(BaseModel):
    prefix: str = Field(description="Names the key; the secret is never stored or shown.")
    team: str
    scope: Scope
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None


class KeysList(BaseModel):
    data: list[KeyPublic]


class KeyCreate(JsonModel):
    model_config = ConfigDict(extra="forbid")

    team: str = Field(min_length=1, max_length=200, description="Created if new.")
    scope: Scope = Scope.submit
    expires_in_days: int | None = Field(None, ge=1, le=MAX_KEY_DAYS, description="null: never.")


class KeyCreated(KeyPublic):
    key: str = Field(description="The key itself, shown only in this answer.")
