"""The time left a run tells, evals included (a real model's evals outlast its steps: the
dashboard's ETA and the bars counted steps alone and said minutes where it took quarter
hours)."""

from __future__ import annotations

from kernel.progress import JobProgress, Phase
from kernel.spec.eval import EvalSpec
from worker.engine.loop.pace import Pace


def test_the_time_left_counts_the_evals_to_come_at_their_time_per_prompt():
    now = [0.0]
    spec = EvalSpec(every=5, holdout=20)
    pace = Pace(10, spec, lambda step: 40 if step == 0 else 20, clock=lambda: now[0])

    assert pace.evaluating(0, 0) == JobProgress(
        phase=Phase.evaluating, step=0, eval_done=0, eval_total=40, eta_seconds=None
    )
    now[0] = 20.0
    assert pace.evaluating(0, 10).eta_seconds is None, "no step timed yet"
    now[0] = 80.0
    assert pace.evaluated(0) == 80.0  # 2 s a prompt
    assert pace.training(0).eta_seconds is None
    pace.trained(10.0)
    # 9 steps of 10 s, and the evals after steps 5 and 10: 40 prompts of 2 s.
    assert pace.training(1).eta_seconds == 9 * 10.0 + 40 * 2.0
    now[0] = 100.0
    evaluating = pace.evaluating(5, 0)
    now[0] = 130.0
    assert pace.evaluating(5, 5).eta_seconds == 5 * 10.0 + (15 + 20) * 2.0
    assert evaluating.line() == "evaluating after step 5: 0/20 prompts"
    assert Pace(10, None, lambda step: 0).training(9).eta_seconds is None
