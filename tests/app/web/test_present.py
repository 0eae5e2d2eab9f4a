"""How pages show durations, ETAs, progress, spec differences and which charts to draw."""

from __future__ import annotations

from datetime import UTC, datetime

from app.web.charts import chart_keys, job_charts
from app.web.present import number, progress
from kernel.progress import duration
from kernel.spec.documents import differing_fields, flatten

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def test_duration_and_number():
    assert [duration(s) for s in (None, -1, 5.9, 65, 3 * 3600 + 7 * 60, 50 * 3600)] == [
        "",
        "",
        "5s",
        "1m 05s",
        "3h 07m",
        "2d 2h",
    ]
    assert number(None) == "–" and number(float("nan")) == "–"
    assert number(1.23456789) == "1.235"


def test_progress():
    assert progress(5, 10, "running") == 0.5
    assert progress(3, 10, "succeeded") == 1.0
    assert progress(12, 10, "running") == 1.0


def test_differing_fields_lists_only_what_differs_with_each_value():
    a = {"name": "a", "loop": {"steps": 3, "batch_size": 2}, "metadata": {}}
    b = {"name": "b", "loop": {"steps": 3, "batch_size": 4}, "metadata": {"x": "1"}}
    assert flatten(a) == {"name": "a", "loop.steps": 3, "loop.batch_size": 2, "metadata": {}}
    assert differing_fields([a, b]) == [
        ("name", ["a", "b"]),
        ("loop.batch_size", [2, 4]),
        ("metadata", [{}, None]),
        ("metadata.x", [None, "1"]),
    ]
    assert differing_fields([a, a]) == []


def test_charts_follow_the_metrics_a_job_recorded():
    names = [
        "opd/reverse_kl_mean",
        "opd/reverse_kl_std",
        "trainer/loss_sum",
        "trainer/loss_mean",
        "data/completion_tokens_per_second",
        "time/step_elapsed_time",
        "time/sample",
        "time/eval",
        "eval/accuracy",
        "data/datums",
    ]
    charts = {chart.id: chart for chart in job_charts(names)}
    assert list(charts) == ["reverse-kl", "loss", "tokens", "times", "eval-time", "eval-accuracy"]
    assert charts["reverse-kl"].band == "opd/reverse_kl_std"
    assert charts["loss"].series == ["trainer/loss_mean"], "the mean is preferred"
    assert charts["times"].series == ["time/sample", "time/step_elapsed_time"]
    assert charts["eval-time"].points, "measured at evals only: points, no line between them"
    assert "data/datums" not in chart_keys(list(charts.values()))
    assert job_charts(["opd/reverse_kl_mean"])[0].band is None
    assert job_charts([]) == []


def test_the_teachers_baseline_is_a_level_line_on_the_students_eval_chart():
    names = [
        "eval/accuracy",
        "eval/teacher_accuracy",
        "eval/accuracy/add",
        "eval/teacher_accuracy/add",
        "eval/teacher_truncated_fraction",
    ]
    charts = {chart.id: chart for chart in job_charts(names)}
    assert list(charts) == ["eval-accuracy", "eval-teacher-truncated_fraction"]
    assert charts["eval-accuracy"].series == ["eval/accuracy", "eval/accuracy/add"]
    assert charts["eval-accuracy"].references == [
        "eval/teacher_accuracy",
        "eval/teacher_accuracy/add",
    ]
    assert "eval/teacher_accuracy" in chart_keys(list(charts.values()))
    assert charts["eval-teacher-truncated_fraction"].series == ["eval/teacher_truncated_fraction"]


def test_a_logit_level_objective_charts_its_value_and_the_kept_teacher_mass():
    names = ["opd/reverse_kl_mean", "opd/objective_mean", "opd/teacher_mass_mean"]
    charts = {chart.id: chart for chart in job_charts(names)}
    assert list(charts) == ["reverse-kl", "objective", "teacher-mass"]
    assert charts["objective"].series == ["opd/objective_mean"]
    assert charts["teacher-mass"].series == ["opd/teacher_mass_mean"]
    assert "objective" not in {c.id for c in job_charts(["opd/reverse_kl_mean"])}


def test_a_cross_tokenizer_teacher_charts_the_aligned_bytes_fraction():
    names = ["opd/reverse_kl_mean", "opd/aligned_bytes_fraction"]
    charts = {chart.id: chart for chart in job_charts(names)}
    assert list(charts) == ["reverse-kl", "aligned"]
    assert charts["aligned"].series == ["opd/aligned_bytes_fraction"]
    several = job_charts([*names, "opd/aligned_bytes_fraction/a", "opd/aligned_bytes_fraction/b"])
    assert [c.series for c in several if c.id == "aligned"] == [
        [
            "opd/aligned_bytes_fraction",
            "opd/aligned_bytes_fraction/a",
            "opd/aligned_bytes_fraction/b",
        ]
    ]
    assert "aligned" not in {c.id for c in job_charts(["opd/reverse_kl_mean"])}


def test_rollout_tokens_are_shaded_by_reverse_kl_and_escaped():
    from app.web.present import Rollout, shade_tokens
    from app.web.templating import templates

    tokens = shade_tokens(["<b>", "2", "+", "3"], [0.0, 0.3, -1.5, None])
    assert [t.shade for t in tokens] == [0, 1, 3, 0]
    macro = templates.env.get_template("macros.html").module.rollout
    html = str(macro(Rollout(step=4, prompt="What is <2+3>?", tokens=tokens)))
    assert "What is &lt;2+3&gt;?" in html and "&lt;b&gt;" in html and "<b>" not in html
    assert 'class="tok kl-3"' in html and 'title="reverse KL -1.5"' in html


def test_a_paused_job_says_why_and_what_resumes_it():
    """The job page showed "paused" alone, even for a job its team's budget paused."""
    from app.web.present import paused_reason

    assert "budget for this period is spent" in (paused_reason("paused", "budget") or "")
    assert paused_reason("paused", None) == (
        "Paused on request: Resume continues from its last saved state"
    )
    assert paused_reason("running", "budget") is None
