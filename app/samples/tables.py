"""The rollouts a job keeps (loop.keep_samples), the teacher's view of each token beside
the student's."""

from datetime import datetime

from sqlalchemy import (
    JSON,
    Text,
    UniqueConstraint,
)
from sqlmodel import Field, SQLModel

from app.core.tables import timestamp


class Sample(SQLModel, table=True):
    """One rollout a job kept: what the student wrote and how far each token was from the
    teacher. Upserted on (job_id, step, position), so a replayed step overwrites."""

    __tablename__ = "samples"
    __table_args__ = (
        UniqueConstraint("job_id", "step", "position", name="uq_samples_job_id_step_position"),
    )

    id: int | None = Field(default=None, primary_key=True)
    job_id: int = Field(foreign_key="jobs.id", ondelete="CASCADE")
    step: int
    position: int
    prompt: str = Field(sa_type=Text)
    completion: str = Field(sa_type=Text)
    tokens: list[str] = Field(sa_type=JSON)
    reverse_kl: list[float | None] = Field(sa_type=JSON)
    truncated: bool = False
    created_at: datetime = timestamp()
