"""Which trials a sweep stops: ASHA and the median rule, each trial judged once per rung.

A trial's rungs are the steps it is judged at (`rungs`); it has reached a rung once it has
recorded that step, and its value there is the sweep metric's last point recorded at or
before it (None when that point was not finite, or there is none: it ranks last).

The controller judges a trial at a rung once, when it first finds the trial there, against
every trial judged at that rung before (their values as recorded then) and the trials it
finds there in the same pass; the judgment is stored and never revisited. So a trial that
reaches a rung early is judged against the few that were there before it (alone, it is the
best so far and continues), and a better trial arriving later does not stop it. A trial
that lost at a rung is judged at no later rung. Every trial that reached a rung is judged
there, a finished one too: the decision then stops nothing, but its value competes.
These functions are the pure rule; app/sweeps/control.py stores what they decide.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from app.sweeps.schemas import EarlyStop

K = TypeVar("K")

MEDIAN_MIN_OTHERS = 2
"""The median rule judges a trial at a rung once this many others are there."""


@dataclass(frozen=True)
class Judgment:
    """A trial's judgment at a rung, as stored."""

    rung: int
    value: float | None
    kept: bool
    competing: int
    """Trials at the rung it was judged against, itself included."""


def rungs(rule: EarlyStop, total_steps: int) -> list[int]:
    """The steps a trial is judged at: min_steps * eta^k (asha), multiples of min_steps
    (median); only those before the trial's end, where stopping still saves steps."""
    steps = []
    step = rule.min_steps
    while step < total_steps:
        steps.append(step)
        step = step * rule.eta if rule.type == "asha" else step + rule.min_steps
    return steps


def pending_rungs(
    rule: EarlyStop, total_steps: int, steps_done: int, last: Judgment | None
) -> list[int]:
    """The rungs a trial has reached (recorded their step) and was not judged at yet, in
    order; none after it lost at one."""
    if last is not None and not last.kept:
        return []
    after = -1 if last is None else last.rung
    return [rung for rung in rungs(rule, total_steps) if after < rung < steps_done]


def cost(value: float | None, maximize: bool) -> float:
    """Lower is better; a missing (non-finite) value is the worst."""
    if value is None:
        return math.inf
    return -value if maximize else value


def decide(
    rule: EarlyStop,
    maximize: bool,
    recorded: Sequence[float | None],
    arriving: Mapping[K, float | None],
) -> dict[K, bool]:
    """Whether each trial arriving at a rung continues, judged against the values recorded
    there before and the others arriving with it. ASHA (Optuna's successive-halving rule):
    it continues if it is among the best max(1, n // eta) of the n trials there, ties kept.
    Median: it continues unless worse than the median of the others there (it always
    continues while fewer than MEDIAN_MIN_OTHERS others are)."""
    field = sorted(cost(value, maximize) for value in [*recorded, *arriving.values()])
    if rule.type == "asha":
        bar = field[max(1, len(field) // rule.eta) - 1]
        return {key: cost(value, maximize) <= bar for key, value in arriving.items()}
    return {
        key: len(field) - 1 < MEDIAN_MIN_OTHERS
        or cost(value, maximize) <= median_without(field, cost(value, maximize))
        for key, value in arriving.items()
    }


def median_without(ordered: Sequence[float], mine: float) -> float:
    """The median of `ordered` (sorted, holding `mine`) with one `mine` left out."""
    left_out = ordered.index(mine)

    def at(index: int) -> float:  # the index-th of the others
        return ordered[index if index < left_out else index + 1]

    count = len(ordered) - 1
    low, high = at((count - 1) // 2), at(count // 2)
    return high if low == high else (low + high) / 2
