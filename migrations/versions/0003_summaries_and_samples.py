"""Job summaries and kept rollouts: `jobs.metric_ends` (each summary metric's first and last
point, filled here from the step rows already recorded) and the `samples` table.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from kernel.summary import SUMMARY_METRICS, advance_ends

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JOBS = sa.table("jobs", sa.column("id"), sa.column("metric_ends", sa.JSON))
STEPS = sa.table(
    "step_metrics", sa.column("job_id"), sa.column("step"), sa.column("metrics", sa.JSON)
)
BATCH = 5_000


def upgrade() -> None:
    with op.batch_alter_table("jobs") as jobs:
        jobs.add_column(
            sa.Column("metric_ends", sa.JSON(), nullable=False, server_default=sa.text("'{}'"))
        )
    op.create_table(
        "samples",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("prompt", sa.Text(), nullable=False),
        sa.Column("completion", sa.Text(), nullable=False),
        sa.Column("tokens", sa.JSON(), nullable=False),
        sa.Column("reverse_kl", sa.JSON(), nullable=False),
        sa.Column("truncated", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_samples_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_samples")),
        sa.UniqueConstraint("job_id", "step", "position", name="uq_samples_job_id_step_position"),
    )
    backfill()


def backfill() -> None:
    """Each job's first and last point of the summary metrics, from its step rows read in
    pages in step order."""
    bind = op.get_bind()
    for job_id in bind.execute(sa.select(STEPS.c.job_id).distinct()).scalars().all():
        ends: dict = {}
        after = -1
        while page := bind.execute(
            sa.select(STEPS.c.step, STEPS.c.metrics)
            .where(STEPS.c.job_id == job_id, STEPS.c.step > after)
            .order_by(STEPS.c.step)
            .limit(BATCH)
        ).all():
            for step, metrics in page:
                wanted = {k: v for k, v in metrics.items() if k in SUMMARY_METRICS.values()}
                ends = advance_ends(ends, step, wanted)
            after = page[-1][0]
        bind.execute(sa.update(JOBS).where(JOBS.c.id == job_id).values(metric_ends=ends))


def downgrade() -> None:
    op.drop_table("samples")
    with op.batch_alter_table("jobs") as jobs:
        jobs.drop_column("metric_ends")
