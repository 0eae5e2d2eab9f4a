"""Sharing the service: key scopes and expiry, team limits, job priority and waiting time,
token usage (per job and per day), the audit log, webhooks and their outbox.

Existing keys keep what they could do: an admin key gets the `admin` scope, any other key
`submit`. A job waits since it was created.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

USAGE = ("sampled_tokens", "teacher_tokens", "trained_tokens", "eval_tokens")
KEYS = sa.table("api_keys", sa.column("is_admin", sa.Boolean), sa.column("scope", sa.String))
JOBS = sa.table("jobs", sa.column("created_at"), sa.column("queued_at"))


def timestamp(name: str, nullable: bool = False) -> sa.Column:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def counters() -> list[sa.Column]:
    return [sa.Column(name, sa.BigInteger(), nullable=False, server_default="0") for name in USAGE]


def upgrade() -> None:
    with op.batch_alter_table("teams") as teams:
        teams.add_column(sa.Column("max_running", sa.Integer(), nullable=True))
        teams.add_column(sa.Column("max_queued", sa.Integer(), nullable=True))

    with op.batch_alter_table("api_keys") as keys:
        keys.add_column(sa.Column("scope", sa.String(16), nullable=True))
        keys.add_column(timestamp("expires_at", nullable=True))
    op.execute(KEYS.update().values(scope=sa.case((KEYS.c.is_admin, "admin"), else_="submit")))
    with op.batch_alter_table("api_keys") as keys:
        keys.alter_column("scope", existing_type=sa.String(16), nullable=False)
        keys.drop_column("is_admin")

    with op.batch_alter_table("jobs") as jobs:
        jobs.add_column(sa.Column("priority", sa.Integer(), nullable=False, server_default="0"))
        jobs.add_column(timestamp("queued_at", nullable=True))
        for column in counters():
            jobs.add_column(column)
    op.execute(JOBS.update().values(queued_at=JOBS.c.created_at))
    with op.batch_alter_table("jobs") as jobs:
        jobs.alter_column("queued_at", existing_type=sa.DateTime(timezone=True), nullable=False)

    create_usage_days()
    create_audit_log()
    create_webhooks()


def create_usage_days() -> None:
    op.create_table(
        "usage_days",
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("day", sa.Date(), nullable=False),
        sa.Column("team_id", sa.Integer(), nullable=False),
        *counters(),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_usage_days_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["team_id"], ["teams.id"], name=op.f("fk_usage_days_team_id_teams")
        ),
        sa.PrimaryKeyConstraint("job_id", "day", name=op.f("pk_usage_days")),
    )
    op.create_index("ix_usage_days_team_id_day", "usage_days", ["team_id", "day"])


def create_audit_log() -> None:
    op.create_table(
        "audit_log",
        sa.Column("id", sa.Integer(), nullable=False),
        timestamp("created_at"),
        sa.Column("key_prefix", sa.String(32), nullable=True),
        sa.Column("team_id", sa.Integer(), nullable=True),
        sa.Column("action", sa.String(64), nullable=False),
        sa.Column("target", sa.Text(), nullable=True),
        sa.Column("status_code", sa.Integer(), nullable=False),
        sa.Column("detail", sa.JSON(), nullable=True),
        sa.ForeignKeyConstraint(["team_id"], ["teams.id"], name=op.f("fk_audit_log_team_id_teams")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit_log")),
    )
    op.create_index("ix_audit_log_team_id_id", "audit_log", ["team_id", "id"])


def create_webhooks() -> None:
    op.create_table(
        "webhooks",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("team_id", sa.Integer(), nullable=False),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("events", sa.JSON(), nullable=False),
        sa.Column("description", sa.Text(), nullable=True),
        sa.Column("secret", sa.String(100), nullable=False),
        timestamp("created_at"),
        timestamp("deleted_at", nullable=True),
        sa.ForeignKeyConstraint(["team_id"], ["teams.id"], name=op.f("fk_webhooks_team_id_teams")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_webhooks")),
    )
    op.create_index("ix_webhooks_team_id", "webhooks", ["team_id"])
    op.create_table(
        "webhook_deliveries",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("webhook_id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=True),
        sa.Column("event", sa.String(32), nullable=False),
        sa.Column("message_id", sa.String(64), nullable=False),
        sa.Column("payload", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        timestamp("created_at"),
        timestamp("next_attempt_at"),
        timestamp("retry_until"),
        timestamp("lease_until", nullable=True),
        timestamp("delivered_at", nullable=True),
        sa.Column("last_status_code", sa.Integer(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["webhook_id"],
            ["webhooks.id"],
            name=op.f("fk_webhook_deliveries_webhook_id_webhooks"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["jobs.id"],
            name=op.f("fk_webhook_deliveries_job_id_jobs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_webhook_deliveries")),
        sa.UniqueConstraint("message_id", name=op.f("uq_webhook_deliveries_message_id")),
    )
    op.create_index(
        "ix_webhook_deliveries_status_next_attempt_at",
        "webhook_deliveries",
        ["status", "next_attempt_at"],
    )
    op.create_index(
        "ix_webhook_deliveries_webhook_id_id", "webhook_deliveries", ["webhook_id", "id"]
    )
    op.create_table(
        "webhook_attempts",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("delivery_id", sa.Integer(), nullable=False),
        timestamp("attempted_at"),
        sa.Column("worker_id", sa.String(200), nullable=False),
        sa.Column("status_code", sa.Integer(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("duration_ms", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["delivery_id"],
            ["webhook_deliveries.id"],
            name=op.f("fk_webhook_attempts_delivery_id_webhook_deliveries"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_webhook_attempts")),
    )
    op.create_index("ix_webhook_attempts_delivery_id_id", "webhook_attempts", ["delivery_id", "id"])


def downgrade() -> None:
    for table in ("webhook_attempts", "webhook_deliveries", "webhooks", "audit_log", "usage_days"):
        op.drop_table(table)
    with op.batch_alter_table("jobs") as jobs:
        for name in ("priority", "queued_at", *USAGE):
            jobs.drop_column(name)
    with op.batch_alter_table("api_keys") as keys:
        keys.add_column(sa.Column("is_admin", sa.Boolean(), nullable=True))
    op.execute(KEYS.update().values(is_admin=KEYS.c.scope == "admin"))
    with op.batch_alter_table("api_keys") as keys:
        keys.alter_column("is_admin", existing_type=sa.Boolean(), nullable=False)
        keys.drop_column("scope")
        keys.drop_column("expires_at")
    with op.batch_alter_table("teams") as teams:
        teams.drop_column("max_running")
        teams.drop_column("max_queued")
