"""One job's tokens on one UTC day."""

from datetime import date

from sqlalchemy import (
    BigInteger,
    Index,
)
from sqlmodel import Field, SQLModel


class UsageDay(SQLModel, table=True):
    """One job's tokens on one UTC day: what `GET /v1/usage` adds up. A replayed step moves
    its count (old values out, new in) on the day it is replayed."""

    __tablename__ = "usage_days"
    __table_args__ = (Index("ix_usage_days_team_id_day", "team_id", "day"),)

    job_id: int = Field(foreign_key="jobs.id", ondelete="CASCADE", primary_key=True)
    day: date = Field(primary_key=True)
    team_id: int = Field(foreign_key="teams.id")
    sampled_tokens: int = Field(default=0, sa_type=BigInteger)
    teacher_tokens: int = Field(default=0, sa_type=BigInteger)
    trained_tokens: int = Field(default=0, sa_type=BigInteger)
    eval_tokens: int = Field(default=0, sa_type=BigInteger)
