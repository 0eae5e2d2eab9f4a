"""ASHA and the median rule as pure decisions: the rungs, which rungs a trial still awaits
judgment at, and who continues among the trials at a rung, including the asynchronous
case where trials reach a rung one after another."""

from __future__ import annotations

from app.sweeps.early_stopping import Judgment, decide, pending_rungs, rungs
from app.sweeps.schemas import EarlyStop

ASHA = EarlyStop(type="asha", min_steps=10, eta=3)
MEDIAN = EarlyStop(type="median", min_steps=5)


def test_rungs_grow_by_eta_for_asha_and_by_min_steps_for_the_median_rule() -> None:
    assert rungs(EarlyStop(type="asha", min_steps=20, eta=3), 200) == [20, 60, 180]
    assert rungs(MEDIAN, 21) == [5, 10, 15, 20]
    assert rungs(ASHA, 30) == [10]  # a rung at the last step saves nothing
    assert rungs(ASHA, 10) == []


def test_a_trial_awaits_judgment_at_the_rungs_it_recorded_and_none_after_a_loss() -> None:
    assert pending_rungs(ASHA, 100, 10, None) == []  # step 10 not recorded yet
    assert pending_rungs(ASHA, 100, 11, None) == [10]
    assert pending_rungs(ASHA, 100, 95, None) == [10, 30, 90]  # caught up all at once
    kept_at_10 = Judgment(10, 0.5, kept=True, competing=2)
    assert pending_rungs(ASHA, 100, 95, kept_at_10) == [30, 90]
    assert pending_rungs(ASHA, 100, 20, kept_at_10) == []  # judged at 10, not at 30 yet
    lost_at_10 = Judgment(10, 0.1, kept=False, competing=3)
    assert pending_rungs(ASHA, 100, 95, lost_at_10) == []


def test_asha_keeps_the_best_third_of_the_trials_at_the_rung_at_least_one() -> None:
    # minimize: lower is better; 6 at the rung -> the best 2 continue
    kept = decide(ASHA, False, [0.1, 0.5, 0.9], {"a": 0.2, "b": 0.3, "c": 0.05})
    assert kept == {"a": False, "b": False, "c": True}
    kept = decide(ASHA, False, [0.1, 0.5, 0.9, 0.7, 0.8], {"a": 0.2})
    assert kept == {"a": True}  # second of 6
    assert decide(ASHA, False, [0.1], {"a": 0.2}) == {"a": False}  # 2 there: only the best
    assert decide(ASHA, False, [0.2], {"a": 0.2}) == {"a": True}  # ties continue


def test_asha_maximizes_too_and_a_missing_value_loses() -> None:
    assert decide(ASHA, True, [0.4], {"up": 0.6, "down": 0.3}) == {"up": True, "down": False}
    assert decide(ASHA, True, [0.4], {"broken": None}) == {"broken": False}
    assert decide(ASHA, False, [None, None], {"broken": None}) == {"broken": True}  # all equal


def test_asynchronous_asha_judges_each_arrival_once_against_those_there_before() -> None:
    """Four trials reach rung 10 one after another (accuracy, maximize): each is judged
    against the ones judged there before it, and its decision stands."""
    arrivals = [("t1", 0.30), ("t2", 0.50), ("t3", 0.40), ("t4", 0.60)]
    recorded: list[float | None] = []
    decisions = {}
    for name, accuracy in arrivals:
        decisions |= decide(ASHA, True, recorded, {name: accuracy})
        recorded.append(accuracy)
    # t1 alone: the best so far; t2 beats it; t3 is second of 3 (keep 1); t4 the best of 4
    assert decisions == {"t1": True, "t2": True, "t3": False, "t4": True}
    # judged together instead, the same four keep only the best one
    together = decide(ASHA, True, [], dict(arrivals))
    assert together == {"t1": False, "t2": False, "t3": False, "t4": True}


def test_the_median_rule_stops_a_trial_worse_than_the_others_median() -> None:
    assert decide(MEDIAN, False, [0.5, 0.7], {"lagging": 0.8}) == {"lagging": False}
    assert decide(MEDIAN, False, [0.5, 0.7], {"leading": 0.6}) == {"leading": True}
    assert decide(MEDIAN, False, [0.5], {"lagging": 0.8}) == {"lagging": True}  # one other
    # judged together, each against the others' median (itself left out)
    kept = decide(MEDIAN, True, [0.2], {"a": 0.3, "b": 0.1, "c": 0.25})
    assert kept == {"a": True, "b": False, "c": True}
    assert decide(MEDIAN, False, [0.5, None, 0.6], {"a": None}) == {"a": False}
