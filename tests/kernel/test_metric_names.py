"""The metric reference's names and placeholders (the loops' tests check, through
tests/fakes/sinks.py, that every metric a run records is listed)."""

from __future__ import annotations

from kernel.metric_names import METRICS, documented
from tests.fakes.sinks import REFERENCE_METRICS


def test_the_reference_scripts_metrics_are_listed_by_their_names() -> None:
    assert METRICS.keys() >= REFERENCE_METRICS


def test_placeholders_stand_for_one_name_part() -> None:
    assert documented("opd/reverse_kl_mean/add")
    assert documented("time/rollout_wait")
    assert documented("eval/pass@4")
    assert documented("eval/accuracy/mul")
    assert documented("trainer/loss_sum")
    assert not documented("time/napping")
    assert not documented("opd/reverse_kl_mean/add/more")
    assert not documented("eval/pass@k")
    assert not documented("train/loss")
