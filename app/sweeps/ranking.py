"""Which trial of a sweep is best: the last recorded value of its metric, compared by the
sweep's goal (pure)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from app.jobs.schemas import JobStatus
from app.sweeps.schemas import (
    SweepMetric,
)

Point = tuple[int, float | None]
"""A metric's value at a step (None: not finite when recorded)."""


class TrialRow(Protocol):
    """What a sweep's summary reads of a trial: a Job, or a row of its columns."""

    id: int | None
    sweep_trial: int | None
    status: str
    steps_done: int
    total_steps: int
    stop_reason: str | None
    metric_ends: dict[str, list[float | None]]


def last_point(trial: TrialRow, metric: str) -> Point | None:
    """The trial's last point of the metric (value None: not finite), kept on the job row
    as steps are recorded (kernel/summary.py): no metric read."""
    ends = trial.metric_ends.get(metric)
    return None if ends is None else (int(ends[2] or 0), ends[3])


def better(a: float, b: float, maximize: bool) -> bool:
    return a > b if maximize else a < b


def comparable(trial: TrialRow, metric: str) -> float | None:
    """A succeeded trial's metric (a stopped or unfinished trial's is not comparable)."""
    point = last_point(trial, metric)
    return point[1] if point and trial.status == JobStatus.succeeded else None


def best_of(trials: Sequence[TrialRow], metric: SweepMetric) -> TrialRow | None:
    """The succeeded trial with the best metric, the first of equals."""
    maximize = metric.goal == "maximize"
    best, best_value = None, None
    for trial in trials:
        value = comparable(trial, metric.name)
        if value is not None and (best_value is None or better(value, best_value, maximize)):
            best, best_value = trial, value
    return best
