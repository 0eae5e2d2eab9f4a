"""Early stopping's judgments as stored (`sweep_rungs`), and the one metric point a
judgment needs: a trial's value at a rung, read from at most a block of step rows and one
block summary, whatever the trial's length."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sqlalchemy import ColumnElement, and_, func, select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import aliased

from app.core.db import insert_for
from app.core.tables import utcnow
from app.curves.blocks import WIDTHS
from app.curves.tables import MetricSummary, StepMetric
from app.jobs.tables import Job
from app.sweeps.early_stopping import Judgment
from app.sweeps.tables import SweepRung

FINEST = WIDTHS[0]


async def points_at(
    session: AsyncSession, key: str, job_ids: Sequence[int], step: int
) -> dict[int, float | None]:
    """Each job's last point of metric `key` at or before `step` (jobs with none left out).
    Every job has recorded `step`, so the blocks before the one holding it are summarised:
    the point is in that block's step rows (at most FINEST), or it is the last point of
    the latest earlier block summary that holds the metric."""
    first = step - step % FINEST
    rows = await session.execute(
        select(StepMetric.job_id, StepMetric.step, StepMetric.metrics)
        .where(StepMetric.job_id.in_(job_ids), StepMetric.step.between(first, step))
        .order_by(StepMetric.step)
    )
    points: dict[int, float | None] = {}
    for job_id, _, metrics in rows:
        if key in metrics:
            points[job_id] = metrics[key]
    earlier = [job_id for job_id in job_ids if job_id not in points]
    if not earlier or first == 0:
        return points
    summary = MetricSummary
    block = (
        select(func.max(summary.block))
        .where(
            summary.job_id == Job.id,
            summary.key == key,
            summary.width == FINEST,
            summary.block < first // FINEST,
        )
        .correlate(Job)
        .scalar_subquery()
    )
    latest = select(Job.id.label("job_id"), block.label("block")).where(Job.id.in_(earlier))
    latest_blocks = latest.subquery()
    found = await session.execute(
        select(summary.job_id, summary.last_value).join(
            latest_blocks,
            and_(
                summary.job_id == latest_blocks.c.job_id,
                summary.block == latest_blocks.c.block,
                summary.key == key,
                summary.width == FINEST,
            ),
        )
    )
    points.update({job_id: value for job_id, value in found})
    return points


JUDGMENT_COLUMNS = (SweepRung.rung, SweepRung.value, SweepRung.kept, SweepRung.competing)


async def latest_judgments(
    session: AsyncSession, trials: ColumnElement[bool]
) -> dict[int, Judgment]:
    """The judgment at its latest rung of each trial (a condition on Job) that has one, by
    job id: one index seek per trial, however many rungs it was judged at."""
    judged = aliased(SweepRung)
    latest = (
        select(func.max(judged.rung))
        .where(judged.job_id == Job.id)
        .correlate(Job)
        .scalar_subquery()
    )
    rows = await session.execute(
        select(SweepRung.job_id, *JUDGMENT_COLUMNS)
        .join(Job, and_(SweepRung.job_id == Job.id, SweepRung.rung == latest))
        .where(trials)
    )
    return {job_id: Judgment(*judged) for job_id, *judged in rows}


async def values_judged_at(session: AsyncSession, sweep_id: int, rung: int) -> list[float | None]:
    """The values of the trials judged at a rung so far."""
    rows = await session.execute(
        select(SweepRung.value).where(SweepRung.sweep_id == sweep_id, SweepRung.rung == rung)
    )
    return list(rows.scalars())


async def record_judgments(
    session: AsyncSession, sweep_id: int, judgments: Mapping[int, Judgment]
) -> None:
    """Store judgments by job id and commit; one already stored for a trial and rung (a
    racing controller's) stays as it is."""
    if not judgments:
        return
    now = utcnow()
    dialect = (await session.connection()).dialect.name
    statement = insert_for(dialect)(SweepRung).values(
        [
            {
                "job_id": job_id,
                "rung": judged.rung,
                "sweep_id": sweep_id,
                "value": judged.value,
                "kept": judged.kept,
                "competing": judged.competing,
                "decided_at": now,
            }
            for job_id, judged in judgments.items()
        ]
    )
    await session.execute(statement.on_conflict_do_nothing(index_elements=["job_id", "rung"]))
    await session.commit()
