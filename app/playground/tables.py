"""Requests answered once (app/playground/replays.py)."""

from datetime import datetime

from sqlalchemy import (
    Index,
    String,
    Text,
    UniqueConstraint,
)
from sqlmodel import Field, SQLModel

from app.core.tables import timestamp


class Replay(SQLModel, table=True):
    """A request sent with an Idempotency-Key whose work no job row keeps (a playground
    sample, a chat completion): made before the work, its `answer` kept once there is one,
    so a repeat until `expires_at` is answered with it instead of being done again."""

    __tablename__ = "replays"
    __table_args__ = (
        UniqueConstraint("team_id", "idempotency_key", name="uq_replays_team_id_idempotency_key"),
        Index("ix_replays_expires_at", "expires_at"),
    )

    id: int | None = Field(default=None, primary_key=True)
    team_id: int = Field(foreign_key="teams.id")
    idempotency_key: str = Field(sa_type=String(255))
    request_hash: str = Field(sa_type=String(64))
    task_id: str = Field(sa_type=String(64))
    """The worker task its work is sent as: a repeat joins it (or finds its answer)."""
    answer: str | None = Field(default=None, sa_type=Text)
    created_at: datetime = timestamp()
    expires_at: datetime = timestamp()
