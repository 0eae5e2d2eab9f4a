"""ASHA and the median rule on recorded curves: who stops, at which rung."""

from __future__ import annotations

from app.early_stopping import rungs, stop_step, value_at
from app.models import EarlyStop

ASHA = EarlyStop(type="asha", min_steps=2, eta=2)
MEDIAN = EarlyStop(type="median", min_steps=5)


def curve(*values: float, every: int = 1) -> list[tuple[int, float | None]]:
    return [(step * every, value) for step, value in enumerate(values)]


def test_rungs_grow_by_eta_for_asha_and_by_min_steps_for_the_median_rule() -> None:
    assert rungs(EarlyStop(type="asha", min_steps=20, eta=3), 200) == [20, 60, 180]
    assert rungs(MEDIAN, 21) == [5, 10, 15, 20]
    assert rungs(ASHA, 2) == []  # a rung at the last step saves nothing


def test_value_at_a_step_is_the_last_one_recorded_by_then() -> None:
    evals = curve(0.1, 0.3, 0.6, every=10)  # steps 0, 10, 20
    assert value_at(evals, 15) == 0.3
    assert value_at(evals, 20) == 0.6
    assert value_at(evals[1:], 5) is None


def test_asha_keeps_the_best_of_each_rung_and_stops_the_rest() -> None:
    good = curve(3.0, 2.0, 1.0, 0.5, 0.4, 0.3, 0.2, 0.1)
    fair = curve(3.0, 2.5, 1.5, 1.2, 1.1, 1.0, 0.9, 0.8)
    bad = curve(3.0, 2.9, 2.8, 2.7)
    assert stop_step(ASHA, good, [], 8, maximize=False) is None  # alone: the best so far
    assert stop_step(ASHA, bad, [good], 8, maximize=False) == 2
    assert stop_step(ASHA, fair, [good], 8, maximize=False) == 2  # eta 2: 1 of 2 continues
    # with four at rung 2, the best two continue; fair is second there, then loses at 4
    worse = curve(3.0, 2.8, 2.6, 2.5, 2.4)
    assert stop_step(ASHA, fair, [good, bad, worse], 8, maximize=False) == 4
    assert stop_step(ASHA, fair[:4], [good, bad, worse], 8, maximize=False) is None  # not at 4 yet


def test_asha_maximizes_too_and_a_missing_value_loses() -> None:
    rising = curve(0.0, 0.2, 0.5)
    flat = curve(0.0, 0.1, 0.1)
    broken = [(0, 0.0), (1, 0.1), (2, None)]
    assert stop_step(ASHA, flat, [rising], 3, maximize=True) == 2
    assert stop_step(ASHA, rising, [flat], 3, maximize=True) is None
    assert stop_step(ASHA, broken, [flat], 3, maximize=True) == 2


def test_the_median_rule_stops_a_trial_worse_than_the_others_median() -> None:
    others = [
        curve(*[1.0 - 0.05 * s for s in range(20)]),
        curve(*[1.0 - 0.04 * s for s in range(20)]),
    ]
    lagging = curve(*[1.0 - 0.01 * s for s in range(12)])
    leading = curve(*[1.0 - 0.06 * s for s in range(12)])
    assert stop_step(MEDIAN, lagging, others, 20, maximize=False) == 5
    assert stop_step(MEDIAN, leading, others, 20, maximize=False) is None
    assert stop_step(MEDIAN, lagging, others[:1], 20, maximize=False) is None  # too few others
    short = [curve(*[0.0] * 4), curve(*[0.0] * 4)]  # never reached step 5
    assert stop_step(MEDIAN, lagging, short, 20, maximize=False) is None
