"""The stored completions of a team and the feedback on them; both go with their team."""

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, Column, Index, SmallInteger, String, Text
from sqlmodel import Field, SQLModel

from app.core.tables import timestamp


class StoredCompletion(SQLModel, table=True):
    """A completion a door served with `store: true`: the request's conversation (or a
    text completion's prompt) and sampling settings, the answer as the door sent it, each
    choice's token ids and logprobs, and the team's metadata."""

    __tablename__ = "stored_completions"
    __table_args__ = (
        Index("ix_stored_completions_team_id_id", "team_id", "id"),
        Index("ix_stored_completions_public_id", "public_id", unique=True),
    )

    id: int | None = Field(default=None, primary_key=True)
    public_id: str = Field(sa_type=String(64))
    """The completion's id as the door answered it (`chatcmpl-...`, `cmpl-...`)."""
    team_id: int = Field(foreign_key="teams.id", ondelete="CASCADE")
    job_id: int = Field(foreign_key="jobs.id", ondelete="CASCADE")
    model: str = Field(sa_type=String(64))
    """The `model` the request named (`job-12`, `job-12:teacher`, `job-12@step-4`)."""
    kind: str = Field(sa_type=String(8))
    """`chat` (/v1/chat/completions) or `text` (/v1/completions)."""
    request: dict[str, Any] = Field(sa_type=JSON)
    """`messages` and `tools` (a chat) or `prompt` (a text), and the sampling settings."""
    response: dict[str, Any] = Field(sa_type=JSON)
    """The answer as the door sent it."""
    tokens: list[dict[str, Any]] = Field(sa_type=JSON)
    """Per choice: `token_ids` and `logprobs`."""
    metadata_: dict[str, str] = Field(
        default_factory=dict, sa_column=Column("metadata", JSON, nullable=False)
    )
    """The team's labels: up to 16 string pairs (OpenAI's `metadata`)."""
    created_at: datetime = timestamp()


class Feedback(SQLModel, table=True):
    """What someone said of a stored completion: a rating (-1, 0, 1), a correction (the
    answer it should have given, or a note), and who said it. Several per completion."""

    __tablename__ = "completion_feedback"
    __table_args__ = (Index("ix_completion_feedback_completion_id", "completion_id", "id"),)

    id: int | None = Field(default=None, primary_key=True)
    completion_id: int = Field(foreign_key="stored_completions.id", ondelete="CASCADE")
    team_id: int = Field(foreign_key="teams.id", ondelete="CASCADE")
    rating: int | None = Field(default=None, sa_type=SmallInteger)
    correction: str | None = Field(default=None, sa_type=Text)
    author: str | None = Field(default=None, sa_type=String(200))
    created_at: datetime = timestamp()
