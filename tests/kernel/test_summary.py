"""A job's summary from the first and last points of a few metrics, kept as steps arrive."""

from __future__ import annotations

from kernel.summary import JobSummary, advance_ends, summary_lines, summary_of_ends

KL, EVAL_KL, ACC, TEACHER = (
    "opd/reverse_kl_mean",
    "eval/reverse_kl_mean",
    "eval/accuracy",
    "eval/teacher_accuracy",
)


def test_the_ends_follow_the_steps_and_a_replay_overwrites():
    ends: dict = {}
    ends = advance_ends(ends, 0, {KL: 2.0, EVAL_KL: 1.5, ACC: 0.1, TEACHER: 0.8, "other": 1.0})
    for step in range(1, 5):
        ends = advance_ends(ends, step, {KL: 2.0 - step / 4})
    ends = advance_ends(ends, 5, {EVAL_KL: 0.7, ACC: 0.4})
    assert ends[KL] == [0, 2.0, 4, 1.0]
    assert ends[ACC] == [0, 0.1, 5, 0.4]
    assert "other" not in ends
    assert advance_ends(ends, 6, {"other": 3.0}, also="other")["other"] == [6, 3.0, 6, 3.0]
    replayed = advance_ends(ends, 4, {KL: 0.9})
    assert replayed[KL] == [0, 2.0, 4, 0.9]
    assert advance_ends(replayed, 0, {KL: 2.5})[KL] == [0, 2.5, 4, 0.9]
    assert ends[KL] == [0, 2.0, 4, 1.0], "the input is left as it was"

    summary = summary_of_ends(ends)
    assert (summary.reverse_kl.first, summary.reverse_kl.last) == (2.0, 1.0)
    assert (summary.eval_accuracy.first, summary.eval_accuracy.last) == (0.1, 0.4)
    assert summary.teacher_accuracy == 0.8
    assert summary_lines(summary) == [
        "reverse KL (training prompts): 2.0000 -> 1.0000",
        "reverse KL (held-out prompts): 1.5000 -> 0.7000",
        "accuracy (held-out prompts): 0.1000 -> 0.4000",
        "teacher's accuracy (held-out prompts): 0.8000",
    ]


def test_a_job_without_metrics_summarises_to_nothing():
    assert summary_of_ends({}) == JobSummary()
    assert summary_lines(JobSummary()) == []
