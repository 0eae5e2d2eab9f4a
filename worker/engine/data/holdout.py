"""Held-out prompts: those of a shuffled pool that its training part (its first
`sample_size`) does not hold, drawn with the eval's seed, so an eval never sees a training
prompt and never changes the training pool."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kernel.errors import OPDError


@dataclass(frozen=True)
class PoolName:
    """How a refusal names a pool: what an eval asks for, the pool's name, and what its
    items are called after their count ("rows ", or nothing)."""

    asked: str
    name: str
    items: str = ""


def held_out(size: int, kept: int | None, count: int, seed: int, pool: PoolName) -> list[int]:
    """The places, in order, of `count` of a shuffled pool's `size` items past its first
    `kept` (none past them when not given), drawn with `seed`; `bad_eval` when fewer are
    left."""
    start = size if kept is None else min(kept, size)
    left = size - start
    if left < count:
        raise OPDError(
            f"eval.holdout asks for {count} {pool.asked} but {pool.name} has {left} "
            f"{pool.items}outside the training pool: lower dataset.sample_size or "
            "eval.holdout, or give eval a dataset of its own",
            code="bad_eval",
        )
    picked = np.random.default_rng(seed).choice(left, size=count, replace=False)
    return [start + int(index) for index in sorted(picked)]
