"""Early stopping decides once per trial and rung: the `sweep_rungs` table keeps each
judgment. A sweep's trial also keeps its sweep's metric in `jobs.metric_ends`, so reading a
sweep reads no metric point; trials recorded before keep it from here (filled from their
step rows).

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-05
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from kernel.summary import SUMMARY_METRICS, advance_ends

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JOBS = sa.table(
    "jobs",
    sa.column("id"),
    sa.column("sweep_id"),
    sa.column("metric_ends", sa.JSON),
)
SWEEPS = sa.table("sweeps", sa.column("id"), sa.column("definition", sa.JSON))
STEPS = sa.table(
    "step_metrics", sa.column("job_id"), sa.column("step"), sa.column("metrics", sa.JSON)
)
BATCH = 5_000


def upgrade() -> None:
    op.create_table(
        "sweep_rungs",
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("rung", sa.Integer(), nullable=False),
        sa.Column("sweep_id", sa.Integer(), nullable=False),
        sa.Column("value", sa.Float(), nullable=True),
        sa.Column("kept", sa.Boolean(), nullable=False),
        sa.Column("competing", sa.Integer(), nullable=False),
        sa.Column("decided_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_sweep_rungs_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["sweep_id"],
            ["sweeps.id"],
            name=op.f("fk_sweep_rungs_sweep_id_sweeps"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("job_id", "rung", name=op.f("pk_sweep_rungs")),
    )
    op.create_index("ix_sweep_rungs_sweep_id_rung", "sweep_rungs", ["sweep_id", "rung"])
    backfill()


def backfill() -> None:
    """Each trial's first and last point of its sweep's metric, when that is no summary
    metric (those are kept already), from its step rows read in pages in step order."""
    bind = op.get_bind()
    trials = bind.execute(
        sa.select(JOBS.c.id, JOBS.c.metric_ends, SWEEPS.c.definition).join(
            SWEEPS, SWEEPS.c.id == JOBS.c.sweep_id
        )
    ).all()
    for job_id, ends, definition in trials:
        metric = definition["metric"]["name"]
        if metric in SUMMARY_METRICS.values():
            continue
        after = -1
        while page := bind.execute(
            sa.select(STEPS.c.step, STEPS.c.metrics)
            .where(STEPS.c.job_id == job_id, STEPS.c.step > after)
            .order_by(STEPS.c.step)
            .limit(BATCH)
        ).all():
            for step, metrics in page:
                if metric in metrics:
                    ends = advance_ends(ends, step, {metric: metrics[metric]}, metric)
            after = page[-1][0]
        bind.execute(sa.update(JOBS).where(JOBS.c.id == job_id).values(metric_ends=ends))


def downgrade() -> None:
    op.drop_index("ix_sweep_rungs_sweep_id_rung", table_name="sweep_rungs")
    op.drop_table("sweep_rungs")
