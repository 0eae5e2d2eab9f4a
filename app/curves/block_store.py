"""Keeping a job's block summaries (app/curves/blocks.py) in step with its step rows.

`record_step` calls `keep_summaries` in its transaction. A step past the newest one
completes the blocks that held the newest step (one step in four completes one or more);
a replayed step whose values changed summarises the complete blocks holding it again, so
the summaries always equal the step rows. Either way it costs one read of the blocks'
children (two when wider blocks complete too) and one write, whatever the number of blocks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import ScalarSelect, delete, func, or_, select, union_all
from sqlalchemy.ext.asyncio import AsyncSession

from app.core.db import insert_for
from app.curves.blocks import (
    FANOUT,
    WIDTHS,
    BlockSummary,
    Summary,
    closed_by,
    complete_holding,
    merge_by_key,
    points_of,
)
from app.curves.tables import MetricSummary, StepMetric

SUMMARY_COLUMNS = tuple(getattr(MetricSummary, name) for name in Summary._fields)
Block = tuple[int, int]  # (width, index)


def step_probe(job_id: int, step: int) -> tuple[ScalarSelect[Any], ScalarSelect[Any]]:
    """The job's newest recorded step and step `step`'s metrics (None if not recorded), as
    expressions the statement that advances the job returns: no extra round trip."""
    of_job = StepMetric.job_id == job_id
    newest = select(func.max(StepMetric.step)).where(of_job).scalar_subquery()
    current = select(StepMetric.metrics).where(of_job, StepMetric.step == step).scalar_subquery()
    return newest, current


async def stored_parts(
    session: AsyncSession, job_id: int, blocks: Sequence[Block]
) -> tuple[list[Mapping[str, Summary]], dict[Block, dict[str, Summary]]]:
    """What the blocks are made of, as stored: the step rows' points of the width-4 block
    (blocks form a chain, finest first), and the summaries of the wider blocks' children
    by child block. One query for each."""
    points: list[Mapping[str, Summary]] = []
    if blocks and blocks[0][0] == WIDTHS[0]:
        first = blocks[0][1] * WIDTHS[0]
        rows = await session.execute(
            select(StepMetric.step, StepMetric.metrics).where(
                StepMetric.job_id == job_id,
                StepMetric.step.between(first, first + WIDTHS[0] - 1),
            )
        )
        points = [points_of(metrics, step) for step, metrics in rows]
    wider = [
        select(MetricSummary.key, MetricSummary.width, MetricSummary.block, *SUMMARY_COLUMNS).where(
            MetricSummary.job_id == job_id,
            MetricSummary.width == width // FANOUT,
            MetricSummary.block.between(index * FANOUT, index * FANOUT + FANOUT - 1),
        )
        for width, index in blocks
        if width > WIDTHS[0]
    ]
    stored: dict[Block, dict[str, Summary]] = {}
    if wider:
        for key, width, block, *summary in await session.execute(union_all(*wider)):
            stored.setdefault((width, block), {})[key] = Summary(*summary)
    return points, stored


def upsert_summaries(dialect: str, rows: list[dict[str, Any]]) -> Any:
    """INSERT .. ON CONFLICT (job_id, key, width, block) DO UPDATE, for the session's database."""
    statement = insert_for(dialect)(MetricSummary).values(rows)
    fields = {name: getattr(statement.excluded, name) for name in Summary._fields}
    return statement.on_conflict_do_update(
        index_elements=["job_id", "key", "width", "block"], set_=fields
    )


async def summarize(
    session: AsyncSession, job_id: int, blocks: Sequence[Block]
) -> list[BlockSummary]:
    """The chain of blocks' summaries, finest first: each from its children as stored,
    except the child summarised just before it (its stored version is stale or missing)."""
    points, stored = await stored_parts(session, job_id, blocks)
    done: dict[Block, dict[str, Summary]] = {}
    for width, index in blocks:
        if width == WIDTHS[0]:
            parts: Sequence[Mapping[str, Summary]] = points
        else:
            kids = [(width // FANOUT, i) for i in range(index * FANOUT, (index + 1) * FANOUT)]
            parts = [done.get(kid, stored.get(kid, {})) for kid in kids]
        done[width, index] = merge_by_key(parts)
    return [
        BlockSummary(key, width, index, summary)
        for (width, index), merged in done.items()
        for key, summary in merged.items()
    ]


async def keep_summaries(
    session: AsyncSession, job_id: int, step: int, newest: int | None, changed: bool
) -> None:
    """After step `step` was written (`newest` was the newest step before it; `changed`:
    its values differ from what the step held), bring the summaries up to date."""
    if newest is None:
        return
    replayed = step <= newest
    if replayed:
        blocks = complete_holding(step, newest) if changed else []
    else:
        blocks = closed_by(step, newest)
    if not blocks:
        return
    summaries = await summarize(session, job_id, blocks)
    if replayed:  # a metric may have left the replayed step: its rows go too
        await session.execute(
            delete(MetricSummary).where(
                MetricSummary.job_id == job_id,
                or_(*((MetricSummary.width == w) & (MetricSummary.block == i) for w, i in blocks)),
            )
        )
    if summaries:
        dialect = (await session.connection()).dialect.name
        await session.execute(upsert_summaries(dialect, [s.row(job_id) for s in summaries]))
