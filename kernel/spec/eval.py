"""The held-out eval: its prompts, how often, how it samples, and the teacher's baseline."""

from __future__ import annotations

import re
from typing import Any

from pydantic import (
    Field,
    field_validator,
    model_validator,
)

from kernel.spec.base import MAX_STEPS, SpecModel, field_error
from kernel.spec.data import DatasetSpec
from kernel.spec.sampling import MAX_TOKENS

MAX_EVAL_PROMPTS = 10_000


MAX_PATTERN_CHARS = 1000


class GraderSpec(SpecModel):
    """What eval/accuracy counts: `boxed` (the default), the last \\boxed{} against the
    reference answer with math-verify; or `{regex: ...}`, a grader of format: an answer is
    accepted when its text, stripped of surrounding whitespace, matches the pattern as a
    whole (every completion graded, no reference answer needed)."""

    regex: str | None = Field(
        None,
        min_length=1,
        max_length=MAX_PATTERN_CHARS,
        description="A Python regular expression, e.g. -?[0-9]+ for a bare number; null = boxed.",
    )

    @model_validator(mode="before")
    @classmethod
    def _boxed_by_name(cls, data: Any) -> Any:
        """`grader: boxed` is `grader: {}`."""
        return {} if data == "boxed" else data

    @field_validator("regex")
    @classmethod
    def _compiles(cls, pattern: str | None) -> str | None:
        try:
            re.compile(pattern or "")
        except re.error as error:
            raise ValueError(f"is not a regular expression: {error}") from None
        return pattern

    @property
    def boxed(self) -> bool:
        return self.regex is None


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
        False,
        description="Also let the teacher answer the same prompts, once (a self teacher "
        "reading its context).",
    )
    grader: GraderSpec = Field(
        default_factory=GraderSpec,
        description="What eval/accuracy counts: boxed, the last \\boxed{} against the "
        "reference answer (math-verify); or {regex: ...}, a full match of the stripped "
        "answer (a format, every completion graded).",
    )
    seed: int = Field(
        0,
        ge=0,
        le=2**31 - 1,
        description="Draws the held-out prompts (`holdout`) and seeds the eval's sampling: "
        "every eval samples alike, so a resumed job reproduces its figures.",
    )

    @model_validator(mode="after")
    def _one_source(self) -> EvalSpec:
        if (self.holdout > 0) == (self.dataset is not None):
            raise field_error(
                ("holdout",), "give eval prompts as one of holdout: N or a dataset (not both)"
            )
        return self
