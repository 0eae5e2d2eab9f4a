"""A job with several datasets and teachers on its page: the per-dataset curves charted
beside the overall ones, and each teacher named."""

from __future__ import annotations

from app.web.charts import job_charts
from app.web.templating import templates


def test_each_datasets_curves_share_a_chart_with_their_figure():
    names = [
        "opd/reverse_kl_mean",
        "opd/reverse_kl_mean/add",
        "opd/reverse_kl_mean/mul",
        "reward/mean",
        "reward/mean/mul",
        "reward/mean/add",
        "eval/accuracy",
        "eval/accuracy/mul",
        "eval/accuracy/add",
        "eval/reverse_kl_mean/add",
        "data/datums/add",
    ]

    charts = {chart.id: chart.series for chart in job_charts(names)}

    assert charts == {
        "reverse-kl": ["opd/reverse_kl_mean"],
        "reverse-kl-datasets": ["opd/reverse_kl_mean/add", "opd/reverse_kl_mean/mul"],
        "reward": ["reward/mean", "reward/mean/add", "reward/mean/mul"],
        "eval-accuracy": ["eval/accuracy", "eval/accuracy/add", "eval/accuracy/mul"],
        "eval-reverse_kl_mean": ["eval/reverse_kl_mean/add"],
    }


def test_a_jobs_teachers_are_shown_by_name_and_model():
    shown = templates.env.get_template("macros.html").module.teacher_models
    two = {"teachers": {"add": {"base_model": "t-add"}, "mul": {"base_model": "t-mul"}}}
    assert str(shown(two | {"teacher": {"base_model": "the-default"}})) == "add: t-add, mul: t-mul"
    assert str(shown({"teacher": {"base_model": "one"}, "teachers": None})) == "one"
