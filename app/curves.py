"""Metric curves from step rows, evenly downsampled for charts (pure functions)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from app.models import MetricCurve


def downsample_indices(count: int, max_points: int) -> list[int]:
    """At most `max_points` evenly spaced indices into `count` items; the first and the
    last are always kept (max_points must be at least 2)."""
    if max_points < 2:
        raise ValueError("max_points must be at least 2, to keep the first and last point")
    if count <= max_points:
        return list(range(count))
    span = (count - 1) / (max_points - 1)
    return [round(i * span) for i in range(max_points)]


def build_curves(
    rows: Iterable[tuple[int, dict[str, Any]]], keys: Sequence[str] | None, max_points: int
) -> dict[str, MetricCurve]:
    """One curve per metric name from (step, metrics) rows in step order; `keys` None means
    every name that occurs. A step without the metric is not a point of its curve."""
    points: dict[str, tuple[list[int], list[float | None]]] = {key: ([], []) for key in keys or ()}
    for step, metrics in rows:
        for key, value in metrics.items():
            if keys is None:
                points.setdefault(key, ([], []))
            if key in points:
                points[key][0].append(step)
                points[key][1].append(value)
    curves = {}
    for key, (steps, values) in points.items():
        kept = downsample_indices(len(steps), max_points)
        curves[key] = MetricCurve(steps=[steps[i] for i in kept], values=[values[i] for i in kept])
    return curves
