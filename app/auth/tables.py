"""Teams and their API keys (only a key's SHA-256 is stored)."""

from datetime import datetime

from sqlalchemy import (
    String,
)
from sqlmodel import Field, SQLModel

from app.auth.schemas import Scope
from app.core.tables import NEVER_REUSED, optional_timestamp, timestamp


class Team(SQLModel, table=True):
    """A team; its limits override the service-wide defaults (None = the default)."""

    __tablename__ = "teams"
    __table_args__ = (NEVER_REUSED,)

    id: int | None = Field(default=None, primary_key=True)
    name: str = Field(sa_type=String(200), unique=True)
    created_at: datetime = timestamp()
    max_running: int | None = None
    max_queued: int | None = None


class ApiKey(SQLModel, table=True):
    """Only the key's SHA-256 is stored; `prefix` names the key in listings and logs."""

    __tablename__ = "api_keys"
    __table_args__ = (NEVER_REUSED,)

    id: int | None = Field(default=None, primary_key=True)
    team_id: int = Field(foreign_key="teams.id", index=True)
    prefix: str = Field(sa_type=String(32), unique=True)
    key_hash: str = Field(sa_type=String(64), unique=True)
    scope: str = Field(default=Scope.submit, sa_type=String(16))
    created_at: datetime = timestamp()
    revoked_at: datetime | None = optional_timestamp()
    expires_at: datetime | None = optional_timestamp()
