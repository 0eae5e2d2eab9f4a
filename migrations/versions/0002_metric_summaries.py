"""Metric summaries: per metric, its min, max, first and last point over blocks of steps,
built here from every job's existing step rows (app/curves/blocks.py).

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

from collections.abc import Iterator, Sequence
from itertools import islice
from typing import Any

import sqlalchemy as sa
from alembic import op

from app.curves.blocks import complete_blocks

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BATCH = 5_000
STEPS = sa.table(
    "step_metrics", sa.column("job_id"), sa.column("step"), sa.column("metrics", sa.JSON)
)


def upgrade() -> None:
    summaries = op.create_table(
        "metric_summaries",
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("width", sa.Integer(), nullable=False),
        sa.Column("block", sa.Integer(), nullable=False),
        sa.Column("points", sa.Integer(), nullable=False),
        sa.Column("first_step", sa.Integer(), nullable=False),
        sa.Column("first_value", sa.Float(), nullable=True),
        sa.Column("last_step", sa.Integer(), nullable=False),
        sa.Column("last_value", sa.Float(), nullable=True),
        sa.Column("min_step", sa.Integer(), nullable=True),
        sa.Column("min_value", sa.Float(), nullable=True),
        sa.Column("max_step", sa.Integer(), nullable=True),
        sa.Column("max_value", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["jobs.id"],
            name=op.f("fk_metric_summaries_job_id_jobs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint(
            "job_id", "key", "width", "block", name=op.f("pk_metric_summaries")
        ),
        sqlite_with_rowid=False,
    )
    op.create_index(
        "ix_metric_summaries_job_id_width_block", "metric_summaries", ["job_id", "width", "block"]
    )
    backfill(summaries)


def backfill(summaries: sa.Table) -> None:
    """Summarise every job's step rows, one job at a time, read in pages in step order."""
    bind = op.get_bind()
    job_ids = bind.execute(sa.select(STEPS.c.job_id).distinct()).scalars().all()
    for job_id in job_ids:
        blocks = complete_blocks(step_rows(bind, job_id))
        while batch := list(islice(blocks, BATCH)):
            bind.execute(summaries.insert(), [block.row(job_id) for block in batch])


def step_rows(bind: sa.Connection, job_id: int) -> Iterator[tuple[int, dict[str, Any]]]:
    """The job's step rows in step order, a page at a time (no cursor stays open)."""
    after = -1
    while page := bind.execute(
        sa.select(STEPS.c.step, STEPS.c.metrics)
        .where(STEPS.c.job_id == job_id, STEPS.c.step > after)
        .order_by(STEPS.c.step)
        .limit(BATCH)
    ).all():
        yield from ((step, metrics) for step, metrics in page)
        after = page[-1][0]


def downgrade() -> None:
    op.drop_table("metric_summaries")
