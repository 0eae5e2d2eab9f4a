"""Migration 0012 on a database filled at the revision before it: `job.submit` entries are
renamed `job.create` (the act's one name), the others stay, and the downgrade renames back."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from alembic import command
from sqlalchemy import MetaData, Table, select

from app.core.db import alembic_config, create_sync_engine, migrate
from tests.migrations.test_0007_sweeps import NOW
from tests.support import migrated_database


@pytest.fixture(params=["sqlite", "postgres"])
def old_database(request, tmp_path) -> Iterator[str]:
    """A database at 0010 with a submission's and a cancellation's entries."""
    with migrated_database(request.param, tmp_path, fill) as url:
        yield url


def fill(url: str) -> None:
    migrate(url, "0011")
    engine = create_sync_engine(url)
    try:
        with engine.begin() as conn:
            audit = Table("audit_log", MetaData(), autoload_with=conn)
            for action in ("job.submit", "job.cancel"):
                row = {"action": action, "status_code": 200, "created_at": NOW}
                conn.execute(audit.insert().values(**row))
    finally:
        engine.dispose()


def actions(url: str) -> list[str]:
    engine = create_sync_engine(url)
    try:
        with engine.connect() as conn:
            audit = Table("audit_log", MetaData(), autoload_with=conn)
            return list(conn.execute(select(audit.c.action).order_by(audit.c.id)).scalars())
    finally:
        engine.dispose()


def test_upgrade_names_submissions_job_create_and_downgrade_names_them_back(old_database):
    migrate(old_database)
    assert actions(old_database) == ["job.create", "job.cancel"]
    command.downgrade(alembic_config(old_database), "0011")
    assert actions(old_database) == ["job.submit", "job.cancel"]
