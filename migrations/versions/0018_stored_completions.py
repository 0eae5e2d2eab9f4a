"""Stored completions (`store: true` on the completions doors) and the feedback on them,
both deleted with their team.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-10
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "stored_completions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("public_id", sa.String(64), nullable=False),
        sa.Column("team_id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("model", sa.String(64), nullable=False),
        sa.Column("kind", sa.String(8), nullable=False),
        sa.Column("request", sa.JSON(), nullable=False),
        sa.Column("response", sa.JSON(), nullable=False),
        sa.Column("tokens", sa.JSON(), nullable=False),
        sa.Column("metadata", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["team_id"],
            ["teams.id"],
            name=op.f("fk_stored_completions_team_id_teams"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["jobs.id"],
            name=op.f("fk_stored_completions_job_id_jobs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_stored_completions")),
    )
    op.create_index(
        "ix_stored_completions_team_id_id", "stored_completions", ["team_id", "id"], unique=False
    )
    op.create_index(
        "ix_stored_completions_public_id", "stored_completions", ["public_id"], unique=True
    )
    op.create_table(
        "completion_feedback",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("completion_id", sa.Integer(), nullable=False),
        sa.Column("team_id", sa.Integer(), nullable=False),
        sa.Column("rating", sa.SmallInteger(), nullable=True),
        sa.Column("correction", sa.Text(), nullable=True),
        sa.Column("author", sa.String(200), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["completion_id"],
            ["stored_completions.id"],
            name=op.f("fk_completion_feedback_completion_id_stored_completions"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["team_id"],
            ["teams.id"],
            name=op.f("fk_completion_feedback_team_id_teams"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_completion_feedback")),
    )
    op.create_index(
        "ix_completion_feedback_completion_id",
        "completion_feedback",
        ["completion_id", "id"],
        unique=False,
    )


def downgrade() -> None:
    op.drop_table("completion_feedback")
    op.drop_table("stored_completions")
