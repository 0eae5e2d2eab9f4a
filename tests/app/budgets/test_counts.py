"""The estimate's arithmetic (app/budgets/counts.py) and the budget's rules
(app/budgets/rules.py), pure: figures worked out by hand."""

from __future__ import annotations

from datetime import UTC, date, datetime

import pytest

from app.budgets.counts import (
    Lengths,
    Shape,
    Span,
    early_stopping_saving,
    eval_boundaries,
    share_run,
    tokens,
)
from app.budgets.rules import Limit, Period, Spend, exhausted, left, past_soft, period_of


def test_a_runs_tokens_follow_the_loops_accounting():
    shape = Shape(steps=10, completions_per_step=8, readers=2, evals=3, eval_completions=4)
    lengths = Lengths(
        completion=Span(1, 5, 12),
        prompt=Span.exactly(20),
        teacher_prompt=Span.exactly(30),
        eval_completion=Span(1, 6, 12),
        baseline_completion=Span(1, 6, 12),
    )
    figures = tokens(shape, lengths)
    completions = 10 * 8
    assert figures.sampled == Span(completions * 1, completions * 5, completions * 12)
    assert figures.trained == Span(completions * 20, completions * 24, completions * 31)
    assert figures.teacher.point == completions * 2 * (30 + 5)
    # each eval: 4 completions sampled (6 tokens) and read by 2 teachers (30 + 6)
    assert figures.eval.point == 3 * 4 * (6 + 2 * 36)


def test_the_teacher_baseline_is_counted_once():
    shape = Shape(steps=1, completions_per_step=1, readers=1, evals=2, eval_completions=5)
    with_baseline = Shape(**{**shape.__dict__, "baseline": True})
    lengths = Lengths(*(Span.exactly(n) for n in (3, 10, 10, 4, 7)))
    extra = tokens(with_baseline, lengths).eval.point - tokens(shape, lengths).eval.point
    assert extra == 5 * (7 + 10 + 7)  # the answer sampled, then read with its prompt


@pytest.mark.parametrize(
    ("steps", "every", "evals"), [(10, 0, 2), (10, 5, 3), (10, 3, 5), (1, 1, 2), (200, 50, 5)]
)
def test_evals_run_before_the_first_step_every_n_and_after_the_last(steps, every, evals):
    assert eval_boundaries(steps, every) == evals


def test_early_stopping_saves_nothing_at_worst_and_never_the_best_trials_run():
    share = share_run([10, 30], 90, 1 / 3)
    assert share.low == pytest.approx(10 / 90) and share.high == 1
    assert share.point == pytest.approx((10 + 20 / 3 + 60 / 9) / 90)
    trial = Span(100, 200, 300)
    saved = early_stopping_saving([(trial, share)] * 4)
    assert saved.low == 0
    assert saved.high == pytest.approx(3 * 300 * (1 - 10 / 90), abs=1)
    assert early_stopping_saving([(trial, share)]) == Span.exactly(0)


def test_periods_are_utc_months_iso_weeks_and_days():
    now = datetime(2026, 12, 31, 23, 30, tzinfo=UTC)
    assert period_of(Period.month, now) == (date(2026, 12, 1), date(2027, 1, 1))
    assert period_of(Period.week, now) == (date(2026, 12, 28), date(2027, 1, 4))
    assert period_of(Period.day, now) == (date(2026, 12, 31), date(2027, 1, 1))


def test_a_budget_counts_tokens_or_cost_and_is_spent_at_its_limit():
    tokens_budget, cost_budget = Limit(100, None, 0.8), Limit(None, 2.0, 0.5)
    spend = Spend(tokens=100, cost=1.0)
    assert exhausted(tokens_budget, spend) and left(tokens_budget, spend) == 0
    assert not exhausted(cost_budget, spend) and past_soft(cost_budget, spend)
    assert left(cost_budget, spend) == pytest.approx(1.0)
    assert not past_soft(tokens_budget, Spend(tokens=79))
