"""The held-out eval: its prompts, how often, how it samples, and the teacher's baseline."""

from __future__ import annotations

from pydantic import Field, model_validator

from kernel.spec.base import MAX_STEPS, SpecModel, field_error
from kernel.spec.data import DatasetSpec
from kernel.spec.sampling import MAX_TOKENS

MAX_EVAL_PROMPTS = 10_000


class EvalSpec(SpecModel):
    """Held-out evaluation of the student, on a schedule; it never changes the training."""

    every: int = Field(
        0,
        ge=0,
        le=MAX_STEPS,
        description="Steps between evals; 0 = before the first step and "
        "after the last only (both always run).",
    )
    holdout: int = Field(
        0,
        ge=0,
        le=MAX_EVAL_PROMPTS,
        description="Prompts drawn (seeded) from the job's dataset rows the training pool "
        "does not use, with their reference answers.",
    )
    dataset: DatasetSpec | None = Field(None, description="Or a dataset of its own.")
    samples_per_prompt: int = Field(1, ge=1, le=64, description="> 1 adds eval/pass@k.")
    max_tokens: int | None = Field(
        None, ge=1, le=MAX_TOKENS, description="null = sampling.max_tokens."
    )
    temperature: float = Field(
        1.0, ge=0.0, le=10.0, description="1 keeps the reverse-KL estimate on-policy."
    )
    teacher_baseline: bool = Field(
        False, description="Also let the teacher answer the same prompts, once."
    )
    seed: int = Field(0, ge=0, le=2**31 - 1)

    @model_validator(mode="after")
    def _one_source(self) -> EvalSpec:
        if (self.holdout > 0) == (self.dataset is not None):
            raise field_error(
                ("holdout",), "give eval prompts as one of holdout: N or a dataset (not both)"
            )
        return self
