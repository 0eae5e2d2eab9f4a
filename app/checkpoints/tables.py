"""The checkpoints table: every state, sampler and final weights a job saved, recorded as
it is written."""

from datetime import datetime

from sqlalchemy import (
    Index,
    String,
    Text,
)
from sqlmodel import Field, SQLModel

from app.core.tables import timestamp


class Checkpoint(SQLModel, table=True):
    __tablename__ = "checkpoints"
    __table_args__ = (
        Index("ix_checkpoints_job_id_id", "job_id", "id"),
        Index("ix_checkpoints_job_id_step", "job_id", "step"),
        Index("ix_checkpoints_path", "path"),
    )

    id: int | None = Field(default=None, primary_key=True)
    job_id: int = Field(foreign_key="jobs.id", ondelete="CASCADE")
    step: int
    kind: str = Field(sa_type=String(16))
    path: str = Field(sa_type=Text)
    created_at: datetime = timestamp()
