"""The files table: one row per file a team uploaded; its bytes are an object in the
store named by `sha256`, shared by every row with those bytes."""

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, Index, String
from sqlmodel import Field, SQLModel

from app.core.tables import timestamp


class UploadedFile(SQLModel, table=True):
    __tablename__ = "files"
    __table_args__ = (
        Index("ix_files_team_id_id", "team_id", "id"),
        Index("ix_files_sha256", "sha256"),
    )

    id: int | None = Field(default=None, primary_key=True)
    team_id: int = Field(foreign_key="teams.id")
    filename: str = Field(sa_type=String(255))
    format: str = Field(sa_type=String(16))
    bytes: int = Field(sa_type=BigInteger)
    sha256: str = Field(sa_type=String(64))
    rows: int = Field(sa_type=BigInteger)
    question_field: str = Field(sa_type=String(200))
    answer_field: str | None = Field(default=None, sa_type=String(200))
    report: dict[str, Any] = Field(sa_type=JSON)
    """The FileReport of the upload."""
    created_at: datetime = timestamp()
