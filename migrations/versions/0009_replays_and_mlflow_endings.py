"""Answers kept for repeated requests (`replays`: a playground sample or chat completion
sent again with its Idempotency-Key is answered, and billed, once) and the outbox of MLflow
runs to end (`mlflow_endings`: a job that ends without a worker still ends its run).

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-08
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def timestamp(name: str) -> sa.Column:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=False)


def upgrade() -> None:
    op.create_table(
        "replays",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("team_id", sa.Integer(), nullable=False),
        sa.Column("idempotency_key", sa.String(255), nullable=False),
        sa.Column("request_hash", sa.String(64), nullable=False),
        sa.Column("task_id", sa.String(64), nullable=False),
        sa.Column("answer", sa.Text(), nullable=True),
        timestamp("created_at"),
        timestamp("expires_at"),
        sa.ForeignKeyConstraint(["team_id"], ["teams.id"], name=op.f("fk_replays_team_id_teams")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_replays")),
        sa.UniqueConstraint(
            "team_id", "idempotency_key", name="uq_replays_team_id_idempotency_key"
        ),
    )
    op.create_index("ix_replays_expires_at", "replays", ["expires_at"])
    op.create_table(
        "mlflow_endings",
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        timestamp("created_at"),
        timestamp("next_attempt_at"),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["jobs.id"],
            name=op.f("fk_mlflow_endings_job_id_jobs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("job_id", name=op.f("pk_mlflow_endings")),
    )
    op.create_index("ix_mlflow_endings_next_attempt_at", "mlflow_endings", ["next_attempt_at"])


def downgrade() -> None:
    op.drop_index("ix_mlflow_endings_next_attempt_at", table_name="mlflow_endings")
    op.drop_table("mlflow_endings")
    op.drop_index("ix_replays_expires_at", table_name="replays")
    op.drop_table("replays")
