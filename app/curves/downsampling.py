"""Chart curves from block summaries: exact when short, else each bucket's min and max (pure).

A curve over `span` steps asked for at most `max_points` points comes back whole when
span <= max_points. Otherwise the range is cut into `(max_points - 2) // 2` buckets, each
giving its min and its max point in step order, plus the range's first and last points:
a spike is never averaged or strided away, and every point is a recorded one. The range
is covered by the coarsest complete blocks that still give each bucket at least one
(`tile`), so a chart reads about max_points summaries per metric whatever the job's length.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from app.curves.blocks import WIDTHS, Summary
from app.curves.schemas import MetricCurve


@dataclass(frozen=True)
class Run:
    """`count` consecutive blocks of `width` steps from block `first`; width 1 = step rows."""

    width: int
    first: int
    count: int

    @property
    def start(self) -> int:
        return self.first * self.width

    @property
    def end(self) -> int:
        """The last step covered."""
        return (self.first + self.count) * self.width - 1


@dataclass(frozen=True)
class Plan:
    """How steps first..last are read: every point (`exact`), or `buckets` min/max
    buckets (0: only the first and last point) from blocks at most `top` steps wide."""

    first: int
    last: int
    exact: bool
    buckets: int = 0
    top: int = 1

    @property
    def span(self) -> int:
        return self.last - self.first + 1


def plan(first: int, last: int, max_points: int) -> Plan:
    """Exact when the range has at most max_points steps; else min/max buckets (at least
    one for reading, even when max_points < 4 leaves room for only the first and last)."""
    span = last - first + 1
    if span <= max_points:
        return Plan(first, last, exact=True)
    buckets = max(1, (max_points - 2) // 2)
    top = max((w for w in WIDTHS if w * buckets <= span), default=1)
    return Plan(first, last, exact=False, buckets=buckets if max_points >= 4 else 0, top=top)


def tile(first: int, last: int, newest: int, top: int) -> list[Run]:
    """Runs of blocks covering steps first..last exactly, in order, each block as wide as
    alignment allows up to `top`, and complete (before the block holding `newest`)."""
    runs: list[Run] = []
    step = first
    while step <= last:
        width = max(
            (
                w
                for w in WIDTHS
                if w <= top and step % w == 0 and step + w - 1 <= last and step // w < newest // w
            ),
            default=1,
        )
        end = last + 1 if width == 1 else min(last + 1, (newest // width) * width)
        wider = [w for w in WIDTHS if width < w <= top]
        if wider:  # stop where the next wider block can take over
            end = min(end, (step // wider[0] + 1) * wider[0])
        count = (end - step) // width
        if runs and runs[-1].width == width and runs[-1].end + 1 == step:
            runs[-1] = Run(width, runs[-1].first, runs[-1].count + count)
        else:
            runs.append(Run(width, step // width, count))
        step += count * width
    return runs


def exact_curve(points: Sequence[tuple[int, float | None]]) -> MetricCurve:
    return MetricCurve(steps=[s for s, _ in points], values=[v for _, v in points])


def minmax_curve(blocks: Sequence[tuple[int, Summary]], plan: Plan) -> MetricCurve:
    """The curve from one metric's (start step, summary) blocks in step order: the first
    and last points, and each bucket's min and max (ties keep the earlier step)."""
    if not blocks:
        return MetricCurve(steps=[], values=[])
    points = {blocks[0][1].first_step: blocks[0][1].first_value}
    first, buckets, span = plan.first, plan.buckets, plan.span
    bucket = low = high = None
    for start, summary in blocks if buckets else ():
        if (start - first) * buckets // span != bucket:
            points.update((low, high) if low and high else ())
            bucket, low, high = (start - first) * buckets // span, None, None
        if summary.min_step is not None and summary.max_step is not None:
            if low is None or summary.min_value < low[1]:
                low = (summary.min_step, summary.min_value)
            if high is None or summary.max_value > high[1]:
                high = (summary.max_step, summary.max_value)
    points.update((low, high) if low and high else ())
    points[blocks[-1][1].last_step] = blocks[-1][1].last_value
    steps = sorted(points)
    return MetricCurve(steps=steps, values=[points[s] for s in steps])
