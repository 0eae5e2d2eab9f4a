"""Teams and API keys as the API shows them, and what a key may do."""

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field


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


def json_number(value: Any) -> Any:
    """What JSON Schema calls an integer is a number: lax validation would also read `true`
    as 1 and "90" as 90, which the document refuses (12.0 is an integer to both)."""
    if isinstance(value, bool | str):
        raise ValueError("must be a whole number")
    return value


Days = Annotated[int, Field(ge=1, le=MAX_KEY_DAYS), BeforeValidator(json_number)]


class KeysList(BaseModel):
    data: list[KeyPublic]


class KeyCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    team: str = Field(min_length=1, max_length=200, description="Created if new.")
    scope: Scope = Scope.submit
    expires_in_days: Days | None = Field(None, description="null: never.")


class KeyCreated(KeyPublic):
    key: str = Field(description="The key itself, shown only in this answer.")
