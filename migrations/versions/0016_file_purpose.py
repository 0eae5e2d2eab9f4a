"""Files keep the `purpose` of OpenAI's upload form (`fine-tune` when none was sent), which
`GET /v1/files` answers and filters by, as OpenAI's does.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-03
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("files") as files:
        files.add_column(
            sa.Column("purpose", sa.String(64), nullable=False, server_default="fine-tune")
        )


def downgrade() -> None:
    with op.batch_alter_table("files") as files:
        files.drop_column("purpose")
