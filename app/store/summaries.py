"""Keeping a job's block summaries (app/summaries.py) in step with its step rows.

`record_step` calls `keep_summaries` in its transaction: a step past the newest one
completes the blocks that held the newest step (about one block in three steps, each
summarised from its four children); a replayed step whose values changed summarises
the complete blocks holding it again, so the summaries always equal the step rows.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from sqlalchemy import delete, func, insert, select
from sqlalchemy.ext.asyncio import AsyncSession

from app.models import MetricSummary, StepMetric
from app.summaries import (
    FANOUT,
    WIDTHS,
    BlockSummary,
    Summary,
    closed_by,
    complete_holding,
    merge_by_key,
    points_of,
)

SUMMARY_COLUMNS = tuple(getattr(MetricSummary, field.name) for field in fields(Summary))


def summary_of(row: Any) -> Summary:
    return Summary(*(getattr(row, column.key) for column in SUMMARY_COLUMNS))


async def probe_step(
    session: AsyncSession, job_id: int, step: int
) -> tuple[int | None, dict[str, float | None] | None]:
    """The job's newest recorded step and step `step`'s metrics, if recorded: one query."""
    of_job = StepMetric.job_id == job_id
    newest = select(func.max(StepMetric.step)).where(of_job).scalar_subquery()
    current = select(StepMetric.metrics).where(of_job, StepMetric.step == step).scalar_subquery()
    row = (await session.execute(select(newest, current))).one()
    return row[0], row[1]


async def children(
    session: AsyncSession, job_id: int, width: int, index: int
) -> list[Mapping[str, Summary]]:
    """What block (width, index) is made of: its step rows, or its FANOUT narrower blocks."""
    if width == WIDTHS[0]:
        rows = await session.execute(
            select(StepMetric.step, StepMetric.metrics).where(
                StepMetric.job_id == job_id,
                StepMetric.step.between(index * width, index * width + width - 1),
            )
        )
        return [points_of(metrics, step) for step, metrics in rows]
    narrower = width // FANOUT
    rows = await session.execute(
        select(MetricSummary.key, *SUMMARY_COLUMNS).where(
            MetricSummary.job_id == job_id,
            MetricSummary.width == narrower,
            MetricSummary.block.between(index * FANOUT, index * FANOUT + FANOUT - 1),
        )
    )
    return [{row.key: summary_of(row)} for row in rows]


async def summarize_block(session: AsyncSession, job_id: int, width: int, index: int) -> None:
    """(Re)write block (width, index)'s summary of every metric from its children."""
    merged = merge_by_key(await children(session, job_id, width, index))
    await session.execute(
        delete(MetricSummary).where(
            MetricSummary.job_id == job_id,
            MetricSummary.width == width,
            MetricSummary.block == index,
        )
    )
    if merged:
        rows = [BlockSummary(key, width, index, s).row(job_id) for key, s in merged.items()]
        await session.execute(insert(MetricSummary), rows)


async def keep_summaries(
    session: AsyncSession, job_id: int, step: int, newest: int | None, changed: bool
) -> None:
    """After step `step` was written (`newest` was the newest step before it; `changed`:
    its values differ from what the step held), bring the summaries up to date."""
    if newest is None:
        return
    if step > newest:
        blocks = closed_by(step, newest)
    else:
        blocks = complete_holding(step, newest) if changed else []
    for width, index in blocks:  # finest first: each is made of the one before
        await summarize_block(session, job_id, width, index)
