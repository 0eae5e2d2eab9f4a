"""Migration 0010 on a database filled at the revision before it: checkpoints gain indexes
by job and step and by path (the path lookup every submission makes uses it on Postgres),
and the downgrade drops them; the rows stay either way."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from alembic import command
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, MetaData, Table, inspect, select, text

from app.core.db import alembic_config, create_sync_engine, migrate
from tests.migrations.test_0007_sweeps import NOW, job_row
from tests.support import migrated_database

INDEXES = {"ix_checkpoints_job_id_step": ["job_id", "step"], "ix_checkpoints_path": ["path"]}
BEFORE = ScriptDirectory.from_config(alembic_config("sqlite://")).get_revision("0010").down_revision
assert isinstance(BEFORE, str)


@pytest.fixture(params=["sqlite", "postgres"])
def old_database(request, tmp_path) -> Iterator[str]:
    """A database at the revision before 0010 with a job that saved two checkpoints."""
    with migrated_database(request.param, tmp_path, fill) as url:
        yield url


def fill(url: str) -> None:
    migrate(url, BEFORE)
    engine = create_sync_engine(url)
    try:
        with engine.begin() as conn:
            tables = MetaData()
            teams, jobs, checkpoints = (
                Table(name, tables, autoload_with=conn) for name in ("teams", "jobs", "checkpoints")
            )
            team_id = conn.execute(
                teams.insert().values(name="old", created_at=NOW).returning(teams.c.id)
            ).scalar_one()
            job_id = conn.execute(
                jobs.insert().values(job_row(team_id)).returning(jobs.c.id)
            ).scalar_one()
            for step in (1, 2):
                row = {"step": step, "kind": "state", "path": f"/saved/state-{step}"}
                conn.execute(checkpoints.insert().values(job_id=job_id, created_at=NOW, **row))
    finally:
        engine.dispose()


def indexes_and_paths(conn: Connection) -> tuple[dict[str, list[str]], list[str]]:
    """The checkpoints table's indexes other than the one before 0010, and its paths."""
    found = {
        index["name"]: index["column_names"]
        for index in inspect(conn).get_indexes("checkpoints")
        if index["name"] != "ix_checkpoints_job_id_id"
    }
    checkpoints = Table("checkpoints", MetaData(), autoload_with=conn)
    paths = conn.execute(select(checkpoints.c.path).order_by(checkpoints.c.id)).scalars().all()
    return found, list(paths)


def test_upgrade_indexes_checkpoints_by_job_and_step_and_by_path(old_database):
    migrate(old_database)
    engine = create_sync_engine(old_database)
    try:
        with engine.begin() as conn:
            assert indexes_and_paths(conn) == (INDEXES, ["/saved/state-1", "/saved/state-2"])
            if conn.dialect.name != "postgresql":
                return
            conn.execute(text("SET LOCAL enable_seqscan = off"))
            query = text("EXPLAIN SELECT id FROM checkpoints WHERE path IN ('/x', '/y')")
            plan = "\n".join(conn.execute(query).scalars())
            assert "ix_checkpoints_path" in plan, plan
    finally:
        engine.dispose()


def test_downgrade_drops_the_indexes_and_keeps_the_checkpoints(old_database):
    migrate(old_database)
    command.downgrade(alembic_config(old_database), BEFORE)
    engine = create_sync_engine(old_database)
    try:
        with engine.connect() as conn:
            assert indexes_and_paths(conn) == ({}, ["/saved/state-1", "/saved/state-2"])
    finally:
        engine.dispose()
