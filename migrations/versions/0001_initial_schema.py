"""Initial schema: teams, API keys, jobs, step metrics, checkpoints and events.

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def timestamp(name: str, nullable: bool = False) -> sa.Column:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def job_id_column() -> sa.Column:
    return sa.Column("job_id", sa.Integer(), nullable=False)


def upgrade() -> None:
    op.create_table(
        "teams",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        timestamp("created_at"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_teams")),
        sa.UniqueConstraint("name", name=op.f("uq_teams_name")),
    )
    op.create_table(
        "api_keys",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("team_id", sa.Integer(), nullable=False),
        sa.Column("prefix", sa.String(length=32), nullable=False),
        sa.Column("key_hash", sa.String(length=64), nullable=False),
        sa.Column("is_admin", sa.Boolean(), nullable=False),
        timestamp("created_at"),
        timestamp("revoked_at", nullable=True),
        sa.ForeignKeyConstraint(["team_id"], ["teams.id"], name=op.f("fk_api_keys_team_id_teams")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_keys")),
        sa.UniqueConstraint("key_hash", name=op.f("uq_api_keys_key_hash")),
        sa.UniqueConstraint("prefix", name=op.f("uq_api_keys_prefix")),
    )
    op.create_index(op.f("ix_api_keys_team_id"), "api_keys", ["team_id"])
    op.create_table(
        "jobs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("team_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        timestamp("created_at"),
        timestamp("updated_at"),
        timestamp("started_at", nullable=True),
        timestamp("finished_at", nullable=True),
        sa.Column("steps_done", sa.Integer(), nullable=False),
        sa.Column("total_steps", sa.Integer(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        timestamp("heartbeat_at", nullable=True),
        sa.Column("worker_id", sa.String(length=200), nullable=True),
        sa.Column("requested_action", sa.String(length=16), nullable=True),
        sa.Column("error_code", sa.String(length=100), nullable=True),
        sa.Column("error_message", sa.Text(), nullable=True),
        sa.Column("final_weights_path", sa.Text(), nullable=True),
        sa.Column("last_state_path", sa.Text(), nullable=True),
        sa.Column("last_state_step", sa.Integer(), nullable=True),
        sa.Column("queue_reason", sa.Text(), nullable=True),
        sa.Column("enqueue_count", sa.Integer(), nullable=False),
        sa.Column("idempotency_key", sa.String(length=255), nullable=True),
        sa.Column("request_hash", sa.String(length=64), nullable=True),
        sa.ForeignKeyConstraint(["team_id"], ["teams.id"], name=op.f("fk_jobs_team_id_teams")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_jobs")),
        sa.UniqueConstraint("team_id", "idempotency_key", name="uq_jobs_team_idempotency_key"),
    )
    op.create_index("ix_jobs_status", "jobs", ["status"])
    op.create_index("ix_jobs_team_id_id", "jobs", ["team_id", "id"])
    op.create_index("ix_jobs_team_id_status_id", "jobs", ["team_id", "status", "id"])
    op.create_table(
        "step_metrics",
        job_id_column(),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("metrics", sa.JSON(), nullable=False),
        timestamp("recorded_at"),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_step_metrics_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("job_id", "step", name=op.f("pk_step_metrics")),
    )
    op.create_table(
        "checkpoints",
        sa.Column("id", sa.Integer(), nullable=False),
        job_id_column(),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        timestamp("created_at"),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_checkpoints_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_checkpoints")),
    )
    op.create_index("ix_checkpoints_job_id_id", "checkpoints", ["job_id", "id"])
    op.create_table(
        "events",
        sa.Column("id", sa.Integer(), nullable=False),
        job_id_column(),
        timestamp("created_at"),
        sa.Column("level", sa.String(length=16), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("data", sa.JSON(), nullable=True),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_events_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_events")),
    )
    op.create_index("ix_events_job_id_id", "events", ["job_id", "id"])


def downgrade() -> None:
    for table in ("events", "checkpoints", "step_metrics", "jobs", "api_keys", "teams"):
        op.drop_table(table)
