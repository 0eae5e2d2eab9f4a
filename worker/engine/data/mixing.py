"""Several datasets in one run: each step's share of every dataset, and the teacher that
scores each prompt (`Pool.teacher`; a mixture of teachers is teachers/mixture.py's).

Each step takes `max(1, round(B * w / sum w))` prompts from each dataset in turn (the last
takes what is left, and no dataset takes so many that a later one gets none), from
positions that are a function of the step alone, wrapping around each pool: a resumed
run, and one whose rollouts run ahead (`max_steps_off_policy`), take the same prompts. A
single `dataset:` and `teacher:` are the one-pool, one-teacher case of the same path.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kernel.spec import JobSpec, PromptOptions, SharedDataset
from worker.engine.data.prompts import Prompt, Prompts


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
    """One prompt of a step: a question or a conversation, its reference answer and pool."""

    prompt: Prompt
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


def batch_indices(step: int, batch_size: int, pool_size: int) -> list[int]:
    """Prompts of a step: a pure function of the step, wrapping around the pool."""
    return [(step * batch_size + i) % pool_size for i in range(batch_size)]


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
                items.append(Item(prompts.prompts[i], prompts.answers[i], pool))
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
