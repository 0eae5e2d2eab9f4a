"""What a job's steps record: one row of metrics per step, and the block summaries a chart
reads (app/curves/blocks.py)."""

from datetime import datetime

from sqlalchemy import (
    JSON,
    Index,
    Text,
)
from sqlmodel import Field, SQLModel

from app.core.tables import timestamp


class StepMetric(SQLModel, table=True):
    """All metrics of one step; written by upsert so a replayed step overwrites its row."""

    __tablename__ = "step_metrics"

    job_id: int = Field(foreign_key="jobs.id", ondelete="CASCADE", primary_key=True)
    step: int = Field(primary_key=True)
    metrics: dict[str, float | None] = Field(sa_type=JSON)
    recorded_at: datetime = timestamp()


class MetricSummary(SQLModel, table=True):
    """One metric over one complete block of `width` steps (app/curves/blocks.py): what charts
    read, so a curve costs the same whatever the job's length."""

    __tablename__ = "metric_summaries"
    __table_args__ = (
        Index("ix_metric_summaries_job_id_width_block", "job_id", "width", "block"),
        {"sqlite_with_rowid": False},
    )

    job_id: int = Field(foreign_key="jobs.id", ondelete="CASCADE", primary_key=True)
    key: str = Field(sa_type=Text, primary_key=True)
    width: int = Field(primary_key=True)
    block: int = Field(primary_key=True)
    points: int
    first_step: int
    first_value: float | None
    last_step: int
    last_value: float | None
    min_step: int | None
    min_value: float | None
    max_step: int | None
    max_value: float | None
