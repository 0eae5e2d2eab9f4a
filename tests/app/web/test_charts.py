"""Which charts a job page draws and how (app/web/charts.py): evals as points on their own
steps, fractions on a 0..1 axis."""

from __future__ import annotations

from app.web.charts import job_charts


def test_evals_are_points_and_fractions_keep_to_zero_to_one() -> None:
    names = [
        "opd/reverse_kl_mean",
        "eval/accuracy",
        "eval/teacher_accuracy",
        "eval/truncated_fraction",
        "eval/completion_tokens_mean",
        "opd/aligned_bytes_fraction",
    ]
    charts = {chart.id: chart for chart in job_charts(names)}
    assert not charts["reverse-kl"].points and not charts["reverse-kl"].fraction
    assert charts["eval-accuracy"].points and charts["eval-accuracy"].fraction
    assert charts["eval-accuracy"].references == ["eval/teacher_accuracy"]
    assert charts["eval-truncated_fraction"].points and charts["eval-truncated_fraction"].fraction
    tokens = charts["eval-completion_tokens_mean"]
    assert tokens.points and not tokens.fraction
    assert charts["aligned"].fraction and not charts["aligned"].points
