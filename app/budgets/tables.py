"""A team's budget: one row per team that has one; and what requests under way hold of it."""

from datetime import date, datetime

from sqlalchemy import BigInteger, Float, Index, String
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


class BudgetHold(SQLModel, table=True):
    """The most a request under way may spend (a completion's prompts x n x models x
    max_tokens, with the prompts' tokens), held against its team's budget from before it
    starts until its usage is recorded in its place; `expires_at` lets go of one whose
    process died."""

    __tablename__ = "budget_holds"
    __table_args__ = (Index("ix_budget_holds_team_id_expires_at", "team_id", "expires_at"),)

    id: int | None = Field(default=None, primary_key=True)
    team_id: int = Field(foreign_key="teams.id", ondelete="CASCADE")
    tokens: int = Field(sa_type=BigInteger)
    cost: float = Field(default=0.0, sa_type=Float)
    """The tokens priced (0 for tokens no price covers, as spend counts them)."""
    expires_at: datetime = timestamp()
