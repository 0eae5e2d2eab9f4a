"""The files tables: one row per file a team uploaded, its bytes an object in the team's
part of the store named by `sha256` (shared by the team's rows with those bytes); and the
claims that uploads and deletes in flight hold on the team's quota and objects."""

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, Index, String, UniqueConstraint
from sqlmodel import Field, SQLModel

from app.core.tables import NEVER_REUSED, timestamp
from app.files.schemas import DEFAULT_PURPOSE, MAX_PURPOSE_CHARS


class UploadedFile(SQLModel, table=True):
    __tablename__ = "files"
    __table_args__ = (
        Index("ix_files_team_id_id", "team_id", "id"),
        Index("ix_files_sha256", "sha256"),
        UniqueConstraint("team_id", "idempotency_key", name="uq_files_team_id_idempotency_key"),
        NEVER_REUSED,
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
    purpose: str = Field(default=DEFAULT_PURPOSE, sa_type=String(MAX_PURPOSE_CHARS))
    """OpenAI's upload form's `purpose`, as sent."""
    idempotency_key: str | None = Field(default=None, sa_type=String(255))
    request_hash: str | None = Field(default=None, sa_type=String(64))
    """Of the upload that made it (its parameters and its bytes' sha256): a retry with the
    same key must send the same."""
    created_at: datetime = timestamp()


class FileClaim(SQLModel, table=True):
    """What an upload or a delete in flight holds until it ends or `expires_at` passes (a
    process that died holds nothing for long). An upload's: `bytes` of the team's quota,
    and once its bytes are known (`sha256`), their object, which no delete may remove. A
    delete's: the object it is removing, which no upload may count on meanwhile."""

    __tablename__ = "file_claims"
    __table_args__ = (Index("ix_file_claims_team_id_sha256", "team_id", "sha256"),)

    id: int | None = Field(default=None, primary_key=True)
    team_id: int = Field(foreign_key="teams.id")
    kind: str = Field(sa_type=String(8))
    """`upload` or `delete`."""
    sha256: str | None = Field(default=None, sa_type=String(64))
    bytes: int = Field(default=0, sa_type=BigInteger)
    expires_at: datetime = timestamp()
