"""An optional price table: per backend and model, a price per million sampled, scored and
trained tokens (and eval tokens, if given). A job's estimated cost is only ever computed
from prices the table has: a price it lacks makes the estimate unknown (None), never 0."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

MILLION = 1_000_000


class Price(BaseModel):
    """What one model costs on one backend, per million tokens."""

    model_config = ConfigDict(extra="forbid")

    backend: str = Field(min_length=1)
    model: str = Field(min_length=1)
    sampled: float | None = Field(None, ge=0, description="Tokens the student samples.")
    scored: float | None = Field(None, ge=0, description="Tokens this model scores as teacher.")
    trained: float | None = Field(None, ge=0, description="Tokens of the datums trained on.")
    eval: float | None = Field(None, ge=0, description="Tokens the student's evals use.")


class PriceTable:
    """Prices looked up by (backend, model)."""

    def __init__(self, prices: Sequence[Price]) -> None:
        self.prices = {(price.backend, price.model): price for price in prices}

    def __bool__(self) -> bool:
        return bool(self.prices)

    def cost(
        self,
        backend: str,
        student: str,
        teacher: str,
        *,
        sampled: int,
        teacher_tokens: int,
        trained: int,
        eval_tokens: int,
    ) -> float | None:
        """The estimate for this usage: the student's prices for what it sampled, trained
        and evaluated, the teacher's for what it scored; None when a price is missing for
        tokens that were used, or without a table."""
        if not self.prices:
            return None
        student_price = self.prices.get((backend, student))
        teacher_price = self.prices.get((backend, teacher))
        parts = (
            (sampled, student_price and student_price.sampled),
            (teacher_tokens, teacher_price and teacher_price.scored),
            (trained, student_price and student_price.trained),
            (eval_tokens, student_price and student_price.eval),
        )
        total = 0.0
        for tokens, price in parts:
            if tokens == 0:
                continue
            if price is None:
                return None
            total += tokens * price / MILLION
        return total
