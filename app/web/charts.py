"""Which charts a job page draws, from the metric names the job recorded (pure)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from kernel.metric_names import REVERSE_KL

REVERSE_KL_STD = "opd/reverse_kl_std"
LOSSES = ("trainer/loss_mean", "trainer/loss_sum")
TOKENS_PER_SECOND = "data/completion_tokens_per_second"
TIME_PREFIX = "time/"
EVAL_TIME = "time/eval"
"""Recorded at eval steps only: points of their own, not a line across the steps between."""
EVAL_PREFIX = "eval/"
BASELINE_PREFIX = "eval/teacher_"
REWARD = "reward/mean"
OBJECTIVE = "opd/objective_mean"
TEACHER_MASS = "opd/teacher_mass_mean"
ALIGNED = "opd/aligned_bytes_fraction"
MAX_POINTS = 500
"""Buckets a chart asks the curves endpoint for: with min and max kept per bucket, up to
twice as many points, more than a chart's width in pixels."""


@dataclass(frozen=True)
class Chart:
    """One chart: its series (metric names) and, optionally, the metric whose value is a
    ± band around the first series (the reverse KL's std)."""

    id: str
    title: str
    series: list[str]
    band: str | None = None
    references: list[str] = field(default_factory=list)
    """Metrics measured once (the teacher's eval baseline, at step 0), drawn as a level
    line across the chart."""
    points: bool = False
    """Measured at a few steps only (evals): drawn as points, not a line that suggests a
    trend between them."""
    fraction: bool = False
    """A fraction: drawn on a 0..1 axis (an always-zero fraction on uPlot's own range
    was drawn on 0..100)."""

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def job_charts(names: Sequence[str]) -> list[Chart]:
    """Reverse KL (with its std band, and one curve per dataset beside it), a logit-level
    objective's value and kept teacher mass, the fraction of completion bytes a teacher with
    another tokenizer aligned (and each such teacher's), reward, loss, tokens/s, per-phase
    times, each eval's time (points) and every eval curve (each dataset's on its figure's
    chart, the teacher's baseline as a level line on the student's); a chart whose metrics
    the job never recorded is left out."""
    present = set(names)
    charts = []
    if REVERSE_KL in present:
        band = REVERSE_KL_STD if REVERSE_KL_STD in present else None
        charts.append(Chart("reverse-kl", "Reverse KL (mean ± std)", [REVERSE_KL], band))
    if per_dataset := sorted(name for name in present if name.startswith(f"{REVERSE_KL}/")):
        charts.append(Chart("reverse-kl-datasets", "Reverse KL by dataset", per_dataset))
    if OBJECTIVE in present:
        charts.append(Chart("objective", "Objective (per completion position)", [OBJECTIVE]))
    if TEACHER_MASS in present:
        charts.append(
            Chart("teacher-mass", "Teacher mass in the top-k", [TEACHER_MASS], fraction=True)
        )
    if aligned := sorted(name for name in present if name.split("/")[:2] == ALIGNED.split("/")):
        title = "Completion bytes aligned (cross-tokenizer)"
        charts.append(Chart("aligned", title, aligned, fraction=True))
    if rewards := sorted(name for name in present if name.split("/")[:2] == REWARD.split("/")):
        charts.append(Chart("reward", "Reward (mean; by dataset)", rewards))
    loss = next((name for name in LOSSES if name in present), None)
    if loss is not None:
        charts.append(Chart("loss", f"Loss ({loss.removeprefix('trainer/')})", [loss]))
    if TOKENS_PER_SECOND in present:
        charts.append(Chart("tokens", "Completion tokens / s", [TOKENS_PER_SECOND]))
    times = sorted(n for n in present if n.startswith(TIME_PREFIX) and n != EVAL_TIME)
    if times:
        charts.append(Chart("times", "Time per step and phase (s)", times))
    if EVAL_TIME in present:
        charts.append(Chart("eval-time", "Time per held-out eval (s)", [EVAL_TIME], points=True))
    figures: dict[str, list[str]] = {}
    baselines: dict[str, list[str]] = {}
    for name in sorted(name for name in present if name.startswith(EVAL_PREFIX)):
        if name.startswith(BASELINE_PREFIX):
            student = EVAL_PREFIX + name.removeprefix(BASELINE_PREFIX).split("/")[0]
            baselines.setdefault(student, []).append(name)
        else:
            figures.setdefault("/".join(name.split("/")[:2]), []).append(name)
    for figure, series in figures.items():
        slug = figure.removeprefix(EVAL_PREFIX)
        references = baselines.pop(figure, [])
        charts.append(
            Chart(f"eval-{slug}", figure, series, None, references, True, is_fraction(figure))
        )
    for figure, references in baselines.items():  # a baseline without its student's curve
        slug = figure.removeprefix(EVAL_PREFIX)
        title = f"{figure} (teacher)"
        charts.append(
            Chart(f"eval-teacher-{slug}", title, references, None, [], True, is_fraction(figure))
        )
    return charts


FRACTIONS = ("_fraction", "accuracy", "pass@")


def is_fraction(name: str) -> bool:
    """Whether a metric is a share of 0..1 (accuracies, pass@k, truncated and aligned
    fractions)."""
    last = name.split("/")[1] if name.count("/") else name
    return any(part in last for part in FRACTIONS)


def chart_keys(charts: Sequence[Chart]) -> list[str]:
    """Every metric the charts need, once each."""
    keys = [
        key for chart in charts for key in (*chart.series, chart.band, *chart.references) if key
    ]
    return list(dict.fromkeys(keys))
