"""Sweeps: the sweeps table, and on each job the sweep and trial number it is (unique per
sweep) and why a machine cancelled it (`early_stopped`).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def timestamp(name: str, nullable: bool = False) -> sa.Column:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    op.create_table(
        "sweeps",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("team_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(100), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("definition", sa.JSON(), nullable=False),
        sa.Column("base_job_id", sa.Integer(), nullable=True),
        timestamp("created_at"),
        timestamp("updated_at"),
        timestamp("finished_at", nullable=True),
        sa.Column("error_message", sa.Text(), nullable=True),
        sa.Column("lease_owner", sa.String(200), nullable=True),
        timestamp("lease_until", nullable=True),
        sa.ForeignKeyConstraint(["team_id"], ["teams.id"], name=op.f("fk_sweeps_team_id_teams")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_sweeps")),
    )
    op.create_index("ix_sweeps_team_id_id", "sweeps", ["team_id", "id"])
    op.create_index("ix_sweeps_status", "sweeps", ["status"])
    with op.batch_alter_table("jobs") as jobs:
        jobs.add_column(sa.Column("sweep_id", sa.Integer(), nullable=True))
        jobs.add_column(sa.Column("sweep_trial", sa.Integer(), nullable=True))
        jobs.add_column(sa.Column("stop_reason", sa.String(32), nullable=True))
        jobs.create_foreign_key(op.f("fk_jobs_sweep_id_sweeps"), "sweeps", ["sweep_id"], ["id"])
        jobs.create_unique_constraint("uq_jobs_sweep_id_sweep_trial", ["sweep_id", "sweep_trial"])


def downgrade() -> None:
    with op.batch_alter_table("jobs") as jobs:
        jobs.drop_constraint("uq_jobs_sweep_id_sweep_trial", type_="unique")
        jobs.drop_constraint(op.f("fk_jobs_sweep_id_sweeps"), type_="foreignkey")
        jobs.drop_column("stop_reason")
        jobs.drop_column("sweep_trial")
        jobs.drop_column("sweep_id")
    op.drop_index("ix_sweeps_status", table_name="sweeps")
    op.drop_index("ix_sweeps_team_id_id", table_name="sweeps")
    op.drop_table("sweeps")
