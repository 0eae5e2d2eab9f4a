"""The `arithmetic` dataset source: problems generated from a seed, never downloaded.

Each operation's problems are listed in a seeded random order and the operations take
turns, so any prefix of the stream mixes them evenly. The training pool is the first
`count` problems of the stream drawn with the dataset's seed; a held-out set is drawn
from a second stream (the eval's seed) with every training problem left out.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import islice

import numpy as np

from kernel.errors import OPDError
from kernel.spec import ArithmeticDataset
from kernel.spec.data import ArithmeticOp, operand_count

SYMBOLS: dict[str, str] = {"add": "+", "sub": "-", "mul": "*"}


@dataclass(frozen=True)
class Problem:
    op: ArithmeticOp
    left: int
    right: int

    @property
    def question(self) -> str:
        return f"What is {self.left} {SYMBOLS[self.op]} {self.right}?"

    @property
    def answer(self) -> str:
        if self.op == "add":
            return str(self.left + self.right)
        if self.op == "sub":
            return str(self.left - self.right)
        return str(self.left * self.right)


def smallest(digits: int) -> int:
    return 0 if digits == 1 else 10 ** (digits - 1)


def nth_problem(dataset: ArithmeticDataset, op: ArithmeticOp, index: int) -> Problem:
    """Problem number `index` of `op`'s problems (0 <= index < dataset.problem_count(op))."""
    low = smallest(dataset.digits)
    if op == "add":
        row, column = divmod(index, operand_count(dataset.digits))
    elif op == "sub":  # the pairs with left >= right, row by row of a triangle
        row = (math.isqrt(8 * index + 1) - 1) // 2
        column = index - row * (row + 1) // 2
    else:
        row, column = divmod(index, operand_count(dataset.multiplier_digits))
        return Problem(op, low + row, smallest(dataset.multiplier_digits) + column)
    return Problem(op, low + row, low + column)


def stream(dataset: ArithmeticDataset, seed: int | list[int]) -> Iterator[Problem]:
    """Every problem once, in an order `seed` fixes, the operations taking turns."""
    rng = np.random.default_rng(seed)
    orders = [(op, iter(rng.permutation(dataset.problem_count(op)))) for op in dataset.ops]
    while orders:
        for entry in list(orders):
            op, order = entry
            index = next(order, None)
            if index is None:
                orders.remove(entry)
            else:
                yield nth_problem(dataset, op, int(index))


def training_problems(dataset: ArithmeticDataset) -> list[Problem]:
    return list(islice(stream(dataset, dataset.seed), dataset.count))


def held_out_problems(dataset: ArithmeticDataset, count: int, seed: int) -> list[Problem]:
    """`count` problems drawn with `seed`, none of them in the training pool."""
    training = set(training_problems(dataset))
    rest = (p for p in stream(dataset, [dataset.seed, seed]) if p not in training)
    picked = list(islice(rest, count))
    if len(picked) < count:
        raise OPDError(
            f"eval.holdout asks for {count} prompts but the arithmetic problems of "
            f"{', '.join(dataset.ops)} at these digits leave {len(picked)} outside the "
            "training pool: lower dataset.count or eval.holdout, or add digits",
            code="bad_eval",
        )
    return picked
