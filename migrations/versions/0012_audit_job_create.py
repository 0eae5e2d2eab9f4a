"""The audit action `job.submit` is called `job.create`, as the CLI (`opd jobs create`) and
the SDK (`jobs.create`) name the act: old entries are renamed so one filter finds them all.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-02
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute("UPDATE audit_log SET action = 'job.create' WHERE action = 'job.submit'")


def downgrade() -> None:
    op.execute("UPDATE audit_log SET action = 'job.submit' WHERE action = 'job.create'")
