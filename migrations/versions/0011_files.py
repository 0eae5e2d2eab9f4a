"""Uploaded files: one row per file a team uploaded (POST /v1/files), its bytes an object
in the store named by their sha256.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-02
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "files",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("team_id", sa.Integer(), nullable=False),
        sa.Column("filename", sa.String(255), nullable=False),
        sa.Column("format", sa.String(16), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("rows", sa.BigInteger(), nullable=False),
        sa.Column("question_field", sa.String(200), nullable=False),
        sa.Column("answer_field", sa.String(200), nullable=True),
        sa.Column("report", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["team_id"], ["teams.id"], name=op.f("fk_files_team_id_teams")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_files")),
    )
    op.create_index("ix_files_team_id_id", "files", ["team_id", "id"])
    op.create_index("ix_files_sha256", "files", ["sha256"])


def downgrade() -> None:
    op.drop_index("ix_files_sha256", table_name="files")
    op.drop_index("ix_files_team_id_id", table_name="files")
    op.drop_table("files")
