"""Ids a team names are never given again on SQLite: the tables of teams, keys, jobs,
files, sweeps, webhooks and deliveries rebuilt with AUTOINCREMENT (SQLite gave a deleted
last row's id to the next row, so a clone naming file-13 read another upload's bytes).
Postgres's sequences never go back: nothing to do there.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-11
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLES = ("teams", "api_keys", "jobs", "files", "sweeps", "webhooks", "webhook_deliveries")


def rebuild(autoincrement: bool) -> None:
    """Each table copied into one made with (or without) AUTOINCREMENT, rows and ids kept:
    SQLite then counts on from the largest id it copied."""
    if op.get_bind().dialect.name != "sqlite":
        return
    for table in TABLES:
        with op.batch_alter_table(
            table, recreate="always", table_kwargs={"sqlite_autoincrement": autoincrement}
        ):
            pass


def upgrade() -> None:
    rebuild(autoincrement=True)


def downgrade() -> None:
    rebuild(autoincrement=False)
