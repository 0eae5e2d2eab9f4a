"""The sweeps table, and the rungs at which a sweep's trials were judged."""

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    Index,
    String,
    Text,
    UniqueConstraint,
)
from sqlmodel import Field, SQLModel

from app.core.tables import NEVER_REUSED, optional_timestamp, timestamp
from app.sweeps.schemas import SweepStatus


class Sweep(SQLModel, table=True):
    """A search; its trials are the jobs that name it (`Job.sweep_id`). The controller
    that advances it holds `lease_owner` until `lease_until`."""

    __tablename__ = "sweeps"
    __table_args__ = (
        Index("ix_sweeps_team_id_id", "team_id", "id"),
        Index("ix_sweeps_status", "status"),
        UniqueConstraint("team_id", "idempotency_key", name="uq_sweeps_team_idempotency_key"),
        NEVER_REUSED,
    )

    id: int | None = Field(default=None, primary_key=True)
    team_id: int = Field(foreign_key="teams.id")
    name: str = Field(sa_type=String(100))
    status: str = Field(default=SweepStatus.running, sa_type=String(16))
    definition: dict[str, Any] = Field(sa_type=JSON)
    """The SweepCreate as submitted, `base` the validated spec (`base_job`'s if given)."""
    base_job_id: int | None = None
    """The job whose spec `base` is, if the sweep started from one (no foreign key: a
    job names its sweep, and the two tables should not point at each other)."""
    created_at: datetime = timestamp()
    updated_at: datetime = timestamp()
    finished_at: datetime | None = optional_timestamp()
    error_message: str | None = Field(default=None, sa_type=Text)
    lease_owner: str | None = Field(default=None, sa_type=String(200))
    lease_until: datetime | None = optional_timestamp()
    idempotency_key: str | None = Field(default=None, sa_type=String(255))
    request_hash: str | None = Field(default=None, sa_type=String(64))
    """The Idempotency-Key the sweep was created with, and a digest of that request."""


class SweepRung(SQLModel, table=True):
    """The controller's judgment of a trial at one rung of its sweep's early stopping
    (app/sweeps/early_stopping.py): made once, when the trial is first found there, and never
    revisited, so a restarted controller decides as the first did."""

    __tablename__ = "sweep_rungs"
    __table_args__ = (Index("ix_sweep_rungs_sweep_id_rung", "sweep_id", "rung"),)

    job_id: int = Field(foreign_key="jobs.id", ondelete="CASCADE", primary_key=True)
    rung: int = Field(primary_key=True)
    sweep_id: int = Field(foreign_key="sweeps.id", ondelete="CASCADE")
    value: float | None = None
    """The metric's last point at or before the rung (None: not finite, or none)."""
    kept: bool
    competing: int
    """Trials at the rung it was judged against, itself included."""
    decided_at: datetime = timestamp()
