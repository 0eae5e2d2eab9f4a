"""Several teachers scoring one prompt as their weighted mixture (`teacher_mixture:
mixture`): each reads the completion after its own rendering of the question, and the
logprob is log sum_i w_i p_i.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from worker.engine.backends.contract import TeacherShare
from worker.engine.rollouts.datums import completion_slice
from worker.engine.rollouts.sampling import Scored, Scorer


class TeacherMixture:
    """Every teacher scores the tokens; the logprob is log sum_i w_i p_i (weights
    normalised), so the advantage pulls the student toward the mixture. Each teacher reads
    the completion after its own rendering of the question (`of`)."""

    def __init__(self, weights: Sequence[float]) -> None:
        self.shares = np.asarray(weights, dtype=np.float64) / sum(weights)
        self.log_weights = np.log(self.shares)

    def of(self, teachers: Sequence[Scorer]) -> Mixed:
        """The mixture scoring one prompt: its teachers (in the weights' order), each with
        its own prompt."""
        return Mixed(list(teachers), self.log_weights, self.shares)


@dataclass(frozen=True)
class Mixed:
    """The mixture of teachers scoring the completions of one prompt (`Scorer`)."""

    teachers: list[Scorer]
    log_weights: np.ndarray
    weights: np.ndarray
    """The teachers' normalised shares (the trainer reads the mixture with them)."""

    async def score(self, completion: list[int], student_logprobs: Sequence[float]) -> Scored:
        scored = await asyncio.gather(
            *(t.score(completion, student_logprobs) for t in self.teachers)
        )
        mixed = mixture_logprobs([s.logprobs for s in scored], self.log_weights)
        return Scored(
            completion_slice(mixed, 0, len(completion)),
            {name: n for s in scored for name, n in s.teacher_tokens.items()},
            {name: a for s in scored for name, a in s.aligned_bytes.items()},
        )

    def read(self, completion: list[int]) -> dict[str, int]:
        return {name: n for t in self.teachers for name, n in t.read(completion).items()}

    async def trained(
        self, completion: list[int], student_logprobs: Sequence[float]
    ) -> tuple[Scored, list[TeacherShare]]:
        """Every teacher's share, with its weight in the mixture (teachers the trainer reads
        at the student's tokens: the spec refuses one of another tokenizer here)."""
        trained = await asyncio.gather(
            *(t.trained(completion, student_logprobs) for t in self.teachers)
        )
        shares = [
            replace(share, weight=float(weight))
            for (_, teachers), weight in zip(trained, self.weights, strict=True)
            for share in teachers
        ]
        return Scored([], self.read(completion)), shares


def mixture_logprobs(
    scored: Sequence[Sequence[float | None]], log_weights: np.ndarray
) -> list[float | None]:
    """Per position, logsumexp_i(log w_i + lp_i); None where any teacher gives none."""
    mixed: list[float | None] = []
    for values in zip(*scored, strict=True):
        if any(value is None for value in values):
            mixed.append(None)
        else:
            mixed.append(float(np.logaddexp.reduce(log_weights + np.asarray(values, float))))
    return mixed
