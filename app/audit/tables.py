"""The audit log's table: one row per state-changing request."""

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    Index,
    String,
    Text,
)
from sqlmodel import Field, SQLModel

from app.core.tables import timestamp


class AuditEntry(SQLModel, table=True):
    """One state-changing request: who (key prefix and team), what, on what, and how it went."""

    __tablename__ = "audit_log"
    __table_args__ = (Index("ix_audit_log_team_id_id", "team_id", "id"),)

    id: int | None = Field(default=None, primary_key=True)
    created_at: datetime = timestamp()
    key_prefix: str | None = Field(default=None, sa_type=String(32))
    team_id: int | None = Field(default=None, foreign_key="teams.id")
    action: str = Field(sa_type=String(64))
    target: str | None = Field(default=None, sa_type=Text)
    status_code: int
    detail: dict[str, Any] | None = Field(default=None, sa_type=JSON)
