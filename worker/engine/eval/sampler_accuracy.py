"""How often a sampler answers arithmetic problems right, graded exactly as an eval grades:
the decoded completion's last `\\boxed{}` checked by the grader. The arithmetic presets'
manifest records these figures and their tests measure them again."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pytrio.types import ModelInput, SamplingParams

from worker.engine.backends.contract import SamplingClient
from worker.engine.data.arithmetic import Problem
from worker.engine.data.prompts import build_prompt
from worker.engine.eval.evaluation import Grade
from worker.engine.eval.grading import last_boxed

MAX_ANSWER_TOKENS = 16


@dataclass(frozen=True)
class Answers:
    """Per problem: whether the completion holds a complete box, and whether it is right."""

    problems: Sequence[Problem]
    boxed: list[bool]
    correct: list[bool]

    def boxed_fraction(self) -> float:
        return sum(self.boxed) / len(self.boxed)

    def accuracy(self, op: str | None = None) -> float:
        """The fraction right, of every problem or of those of `op`."""
        picked = [c for p, c in zip(self.problems, self.correct, strict=True) if op in (None, p.op)]
        return sum(picked) / len(picked)


async def answer(
    sampler: SamplingClient,
    tokenizer: Any,
    problems: Sequence[Problem],
    suffix: str,
    grade: Grade,
    seed: int = 0,
    temperature: float = 1.0,
) -> Answers:
    """One completion per problem at `temperature` (seeded), graded against its answer."""
    params = SamplingParams(
        max_tokens=MAX_ANSWER_TOKENS, temperature=temperature, seed=seed, stop=[tokenizer.eos_token]
    )
    responses = await asyncio.gather(
        *(
            sampler.sample_async(
                ModelInput.from_ints(build_prompt(tokenizer, p.question, suffix, False)),
                num_samples=1,
                sampling_params=params,
            )
            for p in problems
        )
    )
    texts = [tokenizer.decode(r.sequences[0].tokens, skip_special_tokens=True) for r in responses]
    correct = await grade(texts, [p.answer for p in problems])
    return Answers(problems, [last_boxed(t) is not None for t in texts], correct)
