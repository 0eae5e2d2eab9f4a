"""Sweeps keep the Idempotency-Key they were created with (and a digest of the request),
unique per team, so a retried `POST /v1/sweeps` finds the sweep first made.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-02
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("sweeps") as sweeps:
        sweeps.add_column(sa.Column("idempotency_key", sa.String(255), nullable=True))
        sweeps.add_column(sa.Column("request_hash", sa.String(64), nullable=True))
        sweeps.create_unique_constraint(
            "uq_sweeps_team_idempotency_key", ["team_id", "idempotency_key"]
        )


def downgrade() -> None:
    with op.batch_alter_table("sweeps") as sweeps:
        sweeps.drop_constraint("uq_sweeps_team_idempotency_key", type_="unique")
        sweeps.drop_column("request_hash")
        sweeps.drop_column("idempotency_key")
