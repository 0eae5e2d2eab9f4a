"""Uploads and deletes of files in flight hold claims (`file_claims`: quota bytes reserved
by an upload, an object an upload counts on or a delete is removing), and an upload may
carry an Idempotency-Key (`files.idempotency_key`, `files.request_hash`, unique per team).

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-10
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "file_claims",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("team_id", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(8), nullable=False),
        sa.Column("sha256", sa.String(64), nullable=True),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["team_id"], ["teams.id"], name=op.f("fk_file_claims_team_id_teams")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_file_claims")),
    )
    op.create_index("ix_file_claims_team_id_sha256", "file_claims", ["team_id", "sha256"])
    with op.batch_alter_table("files") as files:
        files.add_column(sa.Column("idempotency_key", sa.String(255), nullable=True))
        files.add_column(sa.Column("request_hash", sa.String(64), nullable=True))
        files.create_unique_constraint(
            "uq_files_team_id_idempotency_key", ["team_id", "idempotency_key"]
        )


def downgrade() -> None:
    with op.batch_alter_table("files") as files:
        files.drop_constraint("uq_files_team_id_idempotency_key", type_="unique")
        files.drop_column("request_hash")
        files.drop_column("idempotency_key")
    op.drop_index("ix_file_claims_team_id_sha256", table_name="file_claims")
    op.drop_table("file_claims")
