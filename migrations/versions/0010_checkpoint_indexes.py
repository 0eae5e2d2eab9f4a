"""Indexes on checkpoints for the lookups every request makes: by job and step (a
playground's or an init_from's weights, the steps a message names) and by path (each
submission's check that a path is not another team's saved weights, and the worker's that
an init_from.path is its team's), which scanned every checkpoint of every job.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-02
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_checkpoints_job_id_step", "checkpoints", ["job_id", "step"])
    op.create_index("ix_checkpoints_path", "checkpoints", ["path"])


def downgrade() -> None:
    op.drop_index("ix_checkpoints_path", table_name="checkpoints")
    op.drop_index("ix_checkpoints_job_id_step", table_name="checkpoints")
