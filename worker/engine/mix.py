"""Several datasets and teachers in one run: each step's share of every dataset, and the
teacher that scores each prompt.

Each step takes `max(1, round(B * w / sum w))` prompts from each dataset in turn (the last
takes what is left, and no dataset takes so many that a later one gets none), from
positions that are a function of the step alone, wrapping around each pool: a resumed
run, and one whose rollouts run ahead (`max_steps_off_policy`), take the same prompts. A
single `dataset:` and `teacher:` are the one-pool, one-teacher case of the same path.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from kernel.spec import JobSpec, PromptOptions, SharedDataset
from worker.engine.datasets import Prompts
from worker.engine.datums import batch_indices, completion_slice
from worker.engine.rollouts import Scored, Scorer


@dataclass(frozen=True)
class Pool:
    """One dataset's prompts, how they are rendered, and (route) the teacher scoring them."""

    name: str
    prompts: Prompts
    options: PromptOptions
    teacher: str | None
    """route: the teacher that scores it; None under mixture."""
    teachers: tuple[str, ...]
    """Every teacher that scores it: its own (route), or all of them (mixture)."""
    weight: float = 1.0


@dataclass(frozen=True)
class Item:
    """One prompt of a step: its question, reference answer and pool."""

    question: str
    answer: str | None
    pool: Pool

    @property
    def teachers(self) -> tuple[str, ...]:
        return self.pool.teachers


def step_counts(batch_size: int, weights: Sequence[float]) -> list[int]:
    """Prompts each dataset gives a step: max(1, round(B * w / sum w)), the last taking
    the rest; each is capped so that every later dataset still gets one."""
    total = sum(weights)
    counts: list[int] = []
    for index, weight in enumerate(weights[:-1]):
        share = max(1, math.floor(batch_size * weight / total + 0.5))
        later = len(weights) - 1 - index
        counts.append(min(share, batch_size - sum(counts) - later))
    return [*counts, batch_size - sum(counts)]


class Mix:
    """The datasets of a run and the prompts each step takes from them."""

    def __init__(self, pools: Sequence[Pool], batch_size: int) -> None:
        self.pools = list(pools)
        self.counts = step_counts(batch_size, [pool.weight for pool in self.pools])

    def items(self, step: int) -> list[Item]:
        items = []
        for pool, count in zip(self.pools, self.counts, strict=True):
            prompts = pool.prompts
            for i in batch_indices(step, count, len(prompts)):
                items.append(Item(prompts.questions[i], prompts.answers[i], pool))
        return items

    def __len__(self) -> int:
        return sum(len(pool.prompts) for pool in self.pools)


def training_pools(spec: JobSpec, prompts: Prompts | Mapping[str, Prompts]) -> list[Pool]:
    """The spec's datasets with their loaded prompts (one `Prompts` for a one-dataset spec)."""
    return pools_of(spec, spec.dataset_shares(), prompts)


def pools_of(
    spec: JobSpec, shares: Sequence[SharedDataset], prompts: Prompts | Mapping[str, Prompts]
) -> list[Pool]:
    """Pools of `shares` (datasets with a name, weight and teacher), their prompts by name."""
    by_name = prompts if isinstance(prompts, Mapping) else {shares[0].name: prompts}
    everyone = tuple(spec.teacher_specs())
    pools = []
    for share in shares:
        teacher = spec.route_of(share)
        scorers = everyone if teacher is None else (teacher,)
        pools.append(Pool(share.name, by_name[share.name], share, teacher, scorers, share.weight))
    return pools


class TeacherMixture:
    """Every teacher scores the tokens; the logprob is log sum_i w_i p_i (weights
    normalised), so the advantage pulls the student toward the mixture. Each teacher reads
    the completion after its own rendering of the question (`of`)."""

    def __init__(self, weights: Sequence[float]) -> None:
        self.log_weights = np.log(np.asarray(weights, dtype=np.float64) / sum(weights))

    def of(self, teachers: Sequence[Scorer]) -> Mixed:
        """The mixture scoring one prompt: its teachers (in the weights' order), each with
        its own prompt."""
        return Mixed(list(teachers), self.log_weights)


@dataclass(frozen=True)
class Mixed:
    """The mixture of teachers scoring the completions of one prompt (`Scorer`)."""

    teachers: list[Scorer]
    log_weights: np.ndarray

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
