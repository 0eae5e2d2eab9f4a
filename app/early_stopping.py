"""Which running trials a sweep stops: pure decisions on recorded curves.

A curve is a trial's (step, value) points of the sweep's metric in step order; its value
at step s is the last point at or before s, and it has reached s once it has a point at s
or later. A trial is judged at each rung it has reached, against the other trials that
reached the same rung; a decision needs nothing but the curves, so it is the same
whichever process makes it, and making it twice does no harm.
"""

from __future__ import annotations

import bisect
import statistics
from collections.abc import Sequence

from app.models import EarlyStop

Curve = Sequence[tuple[int, float | None]]


def value_at(curve: Curve, step: int) -> float | None:
    """The last value recorded at or before `step` (None: none, or not finite)."""
    index = bisect.bisect_right([point for point, _ in curve], step)
    return curve[index - 1][1] if index else None


def reached(curve: Curve, step: int) -> bool:
    return bool(curve) and curve[-1][0] >= step


def rungs(rule: EarlyStop, total_steps: int) -> list[int]:
    """The steps a trial is judged at: min_steps * eta^k (asha), multiples of min_steps
    (median); only those before the trial's end, where stopping still saves steps."""
    steps = []
    step = rule.min_steps
    while step < total_steps:
        steps.append(step)
        step = step * rule.eta if rule.type == "asha" else step + rule.min_steps
    return steps


def ranked(values: Sequence[float | None], maximize: bool) -> list[float]:
    """Best first; a missing (non-finite) value ranks last."""
    worst = float("-inf") if maximize else float("inf")
    filled = [worst if value is None else value for value in values]
    return sorted(filled, reverse=maximize)


def asha_promotes(
    mine: float | None, others: Sequence[float | None], eta: int, maximize: bool
) -> bool:
    """Optuna's successive-halving rule: among the trials at a rung (this one included),
    the best len // eta continue; with fewer than eta, only the best so far does."""
    competing = ranked([mine, *others], maximize)
    keep = max(1, len(competing) // eta)
    value = ranked([mine], maximize)[0]
    return value >= competing[keep - 1] if maximize else value <= competing[keep - 1]


MEDIAN_MIN_OTHERS = 2
"""The median rule judges a rung once this many other trials have reached it."""


def median_keeps(mine: float | None, others: Sequence[float | None], maximize: bool) -> bool:
    """The median stopping rule: continue unless worse than the others' median."""
    if len(others) < MEDIAN_MIN_OTHERS:
        return True
    median = statistics.median(ranked(others, maximize))
    value = ranked([mine], maximize)[0]
    return value >= median if maximize else value <= median


def stop_step(
    rule: EarlyStop, curve: Curve, others: Sequence[Curve], total_steps: int, maximize: bool
) -> int | None:
    """The first rung at which the trial with `curve` loses against `others` (so it
    should stop), or None: it continues."""
    for rung in rungs(rule, total_steps):
        if not reached(curve, rung):
            return None
        mine = value_at(curve, rung)
        there = [value_at(other, rung) for other in others if reached(other, rung)]
        keeps = (
            asha_promotes(mine, there, rule.eta, maximize)
            if rule.type == "asha"
            else median_keeps(mine, there, maximize)
        )
        if not keeps:
            return rung
    return None
