"""A team's budget: one row per team that has one."""

from datetime import date, datetime

from sqlalchemy import BigInteger, Float, String
from sqlmodel import Field, SQLModel

from app.core.tables import timestamp


class TeamBudget(SQLModel, table=True):
    """What a team may spend a period: `tokens` or `cost` (exactly one), warned at `soft`
    of it. `warned_for` is the first day of the period whose soft warning was sent, so
    each period sends one however many processes see the threshold passed."""

    __tablename__ = "team_budgets"

    team_id: int = Field(foreign_key="teams.id", primary_key=True)
    tokens: int | None = Field(default=None, sa_type=BigInteger)
    cost: float | None = Field(default=None, sa_type=Float)
    soft: float = Field(default=0.8, sa_type=Float)
    period: str = Field(default="month", sa_type=String(8))
    warned_for: date | None = None
    updated_at: datetime = timestamp()
