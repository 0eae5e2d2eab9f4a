"""Usage reports: per-job-per-day rows added up by job or by day (and by team for an admin
asking about every team), each with its estimated cost when the price table covers it."""

from __future__ import annotations

from datetime import date
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from app.jobs.schemas import TokenUsage


class GroupBy(StrEnum):
    job = "job"
    day = "day"


class UsageLine(TokenUsage):
    team: str
    job_id: int | None = Field(None, description="With group_by=job.")
    job_name: str | None = Field(None, description="With group_by=job.")
    day: date | None = Field(None, description="With group_by=day (UTC).")
    estimated_cost: float | None = Field(
        None, description="From the price table; null without one or without a needed price."
    )


class UsageTotal(TokenUsage):
    estimated_cost: float | None = None


class UsageReport(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    since: date = Field(description="First day counted (UTC).")
    until: date = Field(description="Last day counted (UTC).")
    from_: date = Field(alias="from", description="Deprecated: the old name of `since`.")
    to: date = Field(description="Deprecated: the old name of `until`.")
    group_by: GroupBy
    team: str | None = Field(description="The team asked about; null: every team.")
    priced: bool = Field(description="Whether the service has a price table.")
    rows: list[UsageLine]
    total: UsageTotal
