"""A team's budget and a spec's estimate as the API shows them."""

from __future__ import annotations

import math
from datetime import date, datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from app.budgets.rules import DEFAULT_SOFT, Period
from kernel.json_types import JsonModel

MAX_TOKENS_BUDGET = 10**15
MAX_COST_BUDGET = 1e12


class BudgetUpdate(JsonModel):
    """`tokens` or `cost` (exactly one), the soft share warned at, and the period."""

    model_config = ConfigDict(extra="forbid")

    tokens: int | None = Field(
        None,
        ge=1,
        le=MAX_TOKENS_BUDGET,
        description="Tokens the team may use a period: sampled, scored, trained and "
        "evaluated together, as `GET /v1/usage` counts them.",
    )
    cost: float | None = Field(
        None,
        gt=0,
        le=MAX_COST_BUDGET,
        description="Or what it may cost, priced by the service's price table (OPD_PRICES).",
    )
    soft: float = Field(
        DEFAULT_SOFT,
        gt=0,
        le=1,
        description="The share of the budget past which the team is warned once a period "
        "(a `budget.threshold` webhook event and a dashboard banner).",
    )
    period: Period = Field(Period.month, description="UTC calendar month, ISO week or day.")

    @model_validator(mode="after")
    def _one_amount(self) -> BudgetUpdate:
        if (self.tokens is None) == (self.cost is None):
            raise ValueError("give the budget as one of tokens: N or cost: X")
        if self.cost is not None and not math.isfinite(self.cost):
            raise ValueError("cost must be a finite number")
        return self


class SpendPublic(BaseModel):
    tokens: int = Field(description="Every token the team's jobs and completions used.")
    cost: float | None = Field(
        description="Their cost from the price table; null without one. Tokens no price "
        "covers are counted in `unpriced_tokens`, not here."
    )
    unpriced_tokens: int


class SpendDay(SpendPublic):
    day: date


class BudgetPublic(BaseModel):
    team: str
    team_id: int
    tokens: int | None = Field(description="The budget in tokens; null: it is in cost.")
    cost: float | None = Field(description="The budget in cost; null: it is in tokens.")
    soft: float
    period: Period
    period_start: date = Field(description="The period's first day (UTC).")
    period_end: datetime = Field(description="When it ends and the next starts from nothing.")
    spent: SpendPublic = Field(description="This period so far.")
    used: float = Field(description="What the budget counts of `spent`: tokens or cost.")
    held: float = Field(
        description="What requests under way hold of it (each completion's most, until its "
        "usage is recorded), in the budget's unit."
    )
    left: float = Field(
        description="What the team may still spend this period: less `used` and `held`."
    )
    fraction: float = Field(description="used / budget.")
    state: Literal["ok", "soft", "exhausted"] = Field(
        description="`soft`: past the soft share; `exhausted`: at the hard limit, so "
        "submissions are refused (429 `budget_exceeded`) and running jobs pause."
    )
    days: list[SpendDay] = Field(description="The period's spend per UTC day, oldest first.")


class TokenSpan(BaseModel):
    low: int = Field(description="Completions that stop at their first token.")
    point: int = Field(description="The best guess: see `basis`.")
    high: int = Field(description="Completions that run to max_tokens.")


class CostSpan(BaseModel):
    low: float
    point: float
    high: float


class BudgetFit(BaseModel):
    """How the estimate compares with what is left of the team's budget."""

    unit: Literal["tokens", "cost"]
    left: float = Field(description="What the team may still spend this period.")
    point_exceeds: bool = Field(description="The point estimate is more than what is left.")
    high_exceeds: bool = Field(description="The high bound is more than what is left.")


class Estimate(BaseModel):
    """What a job will use, with the basis of each figure."""

    sampled_tokens: TokenSpan
    teacher_tokens: TokenSpan
    trained_tokens: TokenSpan
    eval_tokens: TokenSpan
    total_tokens: TokenSpan = Field(description="The four added up: what a budget counts.")
    cost: CostSpan | None = Field(
        description="From the price table; null without one or without a price a figure needs."
    )
    basis: list[str] = Field(description="Where each figure comes from, in words.")
    history: list[int] = Field(
        description="The team's earlier jobs (same student, teachers and dataset) whose "
        "lengths the point estimate used; empty: none was found."
    )
    budget: BudgetFit | None = Field(description="Null: the team has no budget.")


class TrialEstimate(BaseModel):
    number: int
    values: dict[str, object]
    estimate: Estimate


class SweepEstimate(BaseModel):
    """Every trial's estimate, their sum, and what early stopping may save of it."""

    trials: list[TrialEstimate]
    total: Estimate = Field(description="Every trial run to its end, added up.")
    early_stopping_saves: TokenSpan | None = Field(
        description="Tokens early stopping may save of `total.total_tokens` (null: no "
        "early stopping): none at worst, all but the best trial stopped at the first rung "
        "at most."
    )
