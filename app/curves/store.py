"""Reading a job's metrics: chart curves from block summaries, and its step rows in order.

A curve costs three short queries whatever the job's length: the range's extent, the
summaries of the blocks that tile it (one index range per run of blocks), and the few
step rows at its edges (app/curves/downsampling.py decides which).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Select, Text, cast, func, select, union_all
from sqlalchemy.ext.asyncio import AsyncSession

from app.curves.block_store import SUMMARY_COLUMNS
from app.curves.blocks import WIDTHS, Summary, points_of
from app.curves.downsampling import Plan, Run, exact_curve, minmax_curve, plan, tile
from app.curves.schemas import Downsampling, MetricCurve, MetricsPublic
from app.curves.tables import MetricSummary, StepMetric

StepRow = tuple[int, dict[str, float | None]]


@dataclass(frozen=True)
class CurveQuery:
    """Which curves: metric names (None: all the job has), a step range, a point budget."""

    keys: Sequence[str] | None
    from_step: int | None
    to_step: int | None
    max_points: int


async def extent(
    session: AsyncSession, job_id: int, from_step: int | None, to_step: int | None
) -> tuple[int | None, int | None, int | None]:
    """The first and last recorded steps in the range, and the job's newest step."""
    of_job = StepMetric.job_id == job_id
    in_range = [of_job]
    if from_step is not None:
        in_range.append(StepMetric.step >= from_step)
    if to_step is not None:
        in_range.append(StepMetric.step <= to_step)
    # One aggregate per subquery: SQLite answers a lone MIN or MAX from the index.
    first = select(func.min(StepMetric.step)).where(*in_range).scalar_subquery()
    last = select(func.max(StepMetric.step)).where(*in_range).scalar_subquery()
    newest = select(func.max(StepMetric.step)).where(of_job).scalar_subquery()
    row = (await session.execute(select(first, last, newest))).one()
    return row[0], row[1], row[2]


def steps_after(
    metrics: Any, job_id: int, after: int, to_step: int | None, limit: int | None
) -> Select[Any]:
    query = select(StepMetric.step, metrics).where(
        StepMetric.job_id == job_id, StepMetric.step > after
    )
    if to_step is not None:
        query = query.where(StepMetric.step <= to_step)
    return query.order_by(StepMetric.step).limit(limit)


async def step_rows(
    session: AsyncSession,
    job_id: int,
    after: int,
    to_step: int | None = None,
    limit: int | None = None,
) -> list[StepRow]:
    """Step rows after step `after` (up to `to_step`), in step order."""
    rows = await session.execute(steps_after(StepMetric.metrics, job_id, after, to_step, limit))
    return [(step, metrics) for step, metrics in rows.all()]


async def step_texts(
    session: AsyncSession, job_id: int, after: int, to_step: int | None, limit: int
) -> list[tuple[int, str]]:
    """The same rows with each step's metrics as their stored JSON text, for an export to
    copy numbers as written rather than parse and print them again."""
    text = cast(StepMetric.metrics, Text)
    rows = await session.execute(steps_after(text, job_id, after, to_step, limit))
    return [(step, metrics) for step, metrics in rows.all()]


async def run_rows(
    session: AsyncSession, job_id: int, runs: Sequence[Run], keys: Sequence[str] | None
) -> tuple[list[StepRow], list[Any]]:
    """The step rows of the width-1 runs and the summaries of the others."""
    raw: list[Select[Any]] = []
    blocks: list[Select[Any]] = []
    for run in runs:
        if run.width == 1:
            raw.append(
                select(StepMetric.step, StepMetric.metrics).where(
                    StepMetric.job_id == job_id, StepMetric.step.between(run.start, run.end)
                )
            )
            continue
        query = select(
            MetricSummary.key, MetricSummary.width, MetricSummary.block, *SUMMARY_COLUMNS
        ).where(
            MetricSummary.job_id == job_id,
            MetricSummary.width == run.width,
            MetricSummary.block.between(run.first, run.first + run.count - 1),
        )
        blocks.append(query if keys is None else query.where(MetricSummary.key.in_(keys)))
    steps = [(s, m) for s, m in (await session.execute(union_all(*raw))).all()] if raw else []
    summaries = (await session.execute(union_all(*blocks))).all() if blocks else []
    return steps, list(summaries)


def wanted(keys: Sequence[str] | None, found: dict[str, Any]) -> list[str]:
    """The curves to answer: the names asked for (even if never recorded), else all found."""
    return list(keys) if keys is not None else sorted(found)


def exact_curves(rows: Sequence[StepRow], keys: Sequence[str] | None) -> dict[str, MetricCurve]:
    points: dict[str, list[tuple[int, float | None]]] = {}
    for step, metrics in rows:
        for key in metrics if keys is None else (k for k in keys if k in metrics):
            points.setdefault(key, []).append((step, metrics[key]))
    return {key: exact_curve(points.get(key, [])) for key in wanted(keys, points)}


async def minmax_curves(
    session: AsyncSession, job_id: int, shape: Plan, newest: int, keys: Sequence[str] | None
) -> dict[str, MetricCurve]:
    runs = tile(shape.first, shape.last, newest, shape.top)
    steps, summaries = await run_rows(session, job_id, runs, keys)
    blocks: dict[str, list[tuple[int, Summary]]] = {}
    for step, metrics in steps:
        for key, summary in points_of(metrics, step).items():
            blocks.setdefault(key, []).append((step, summary))
    for key, width, block, *summary in summaries:
        blocks.setdefault(key, []).append((block * width, Summary(*summary)))
    for found in blocks.values():
        found.sort(key=lambda block: block[0])
    return {key: minmax_curve(blocks.get(key, []), shape) for key in wanted(keys, blocks)}


async def read_curves(session: AsyncSession, job_id: int, query: CurveQuery) -> MetricsPublic:
    """The job's curves: exact when the range is short, else min/max per bucket."""
    first, last, newest = await extent(session, job_id, query.from_step, query.to_step)
    if first is None or last is None or newest is None:
        empty = {key: MetricCurve(steps=[], values=[]) for key in query.keys or ()}
        how = Downsampling(
            method="none", first_step=None, last_step=None, buckets=None, bucket_steps=None
        )
        return MetricsPublic(job_id=job_id, curves=empty, downsampling=how)
    shape = plan(first, last, query.max_points)
    if shape.exact:
        rows = await step_rows(session, job_id, first - 1, last)
        curves = exact_curves(rows, query.keys)
        how = Downsampling(
            method="none", first_step=first, last_step=last, buckets=None, bucket_steps=None
        )
    else:
        curves = await minmax_curves(session, job_id, shape, newest, query.keys)
        buckets = shape.buckets or None
        how = Downsampling(
            method="minmax",
            first_step=first,
            last_step=last,
            buckets=buckets,
            bucket_steps=-(-shape.span // buckets) if buckets else shape.span,
        )
    return MetricsPublic(job_id=job_id, curves=curves, downsampling=how)


async def metric_names(session: AsyncSession, job_id: int) -> list[str]:
    """Every metric name the job recorded, from the coarsest blocks that tile its steps."""
    first, last, newest = await extent(session, job_id, None, None)
    if first is None or last is None or newest is None:
        return []
    steps, summaries = await run_rows(session, job_id, tile(first, last, newest, WIDTHS[-1]), None)
    names = {row.key for row in summaries}
    for _, metrics in steps:
        names.update(metrics)
    return sorted(names)
