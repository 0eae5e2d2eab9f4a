"""One job's tokens on one UTC day, and a team's by the models they are priced at."""

from datetime import date

from sqlalchemy import (
    BigInteger,
    Index,
    String,
    Text,
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


class TeamSpendDay(SQLModel, table=True):
    """A team's tokens on one UTC day, by the models they are priced at (the backend, the
    student, the teacher as `priced_teacher` names it): what a budget adds up, a few rows
    a day however many jobs the team runs."""

    __tablename__ = "team_spend_days"

    team_id: int = Field(foreign_key="teams.id", primary_key=True)
    day: date = Field(primary_key=True)
    backend: str = Field(sa_type=String(32), primary_key=True)
    student: str = Field(sa_type=Text, primary_key=True)
    teacher: str = Field(sa_type=Text, primary_key=True)
    sampled_tokens: int = Field(default=0, sa_type=BigInteger)
    teacher_tokens: int = Field(default=0, sa_type=BigInteger)
    trained_tokens: int = Field(default=0, sa_type=BigInteger)
    eval_tokens: int = Field(default=0, sa_type=BigInteger)
