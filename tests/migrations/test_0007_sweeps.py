"""Migration 0007 on a database filled at revision 0004: existing jobs are no sweep's
trials, a trial number is unique per sweep, and the downgrade drops the sweeps and keeps
the jobs."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from alembic import command
from sqlalchemy import MetaData, Table, inspect, select
from sqlalchemy.exc import IntegrityError

from app.core.db import alembic_config, create_sync_engine, migrate
from tests.app.conftest import small_spec
from tests.support import migrated_database

NOW = datetime(2026, 12, 1, tzinfo=UTC)


@pytest.fixture(params=["sqlite", "postgres"])
def old_database(request, tmp_path) -> Iterator[str]:
    """A database at revision 0004 with a team and a job."""
    with migrated_database(request.param, tmp_path, fill) as url:
        yield url


def fill(url: str) -> None:
    migrate(url, "0004")
    engine = create_sync_engine(url)
    try:
        with engine.begin() as conn:
            tables = MetaData()
            teams, jobs = (Table(name, tables, autoload_with=conn) for name in ("teams", "jobs"))
            team_id = conn.execute(
                teams.insert().values(name="old", created_at=NOW).returning(teams.c.id)
            ).scalar_one()
            conn.execute(jobs.insert().values(job_row(team_id)))
    finally:
        engine.dispose()


def job_row(team_id: int, **extra: object) -> dict[str, object]:
    return {
        "team_id": team_id, "name": "old", "status": "queued", "spec": small_spec(),
        "created_at": NOW, "updated_at": NOW, "queued_at": NOW, "steps_done": 0,
        "total_steps": 3, "attempts": 0, "enqueue_count": 1, "metric_ends": {}, **extra,
    }  # fmt: skip


def test_upgrade_leaves_old_jobs_outside_sweeps_and_trials_unique(old_database):
    migrate(old_database)
    engine = create_sync_engine(old_database)
    try:
        with engine.begin() as conn:
            tables = MetaData()
            teams, jobs, sweeps = (
                Table(name, tables, autoload_with=conn) for name in ("teams", "jobs", "sweeps")
            )
            assert conn.execute(select(jobs.c.sweep_id, jobs.c.sweep_trial)).all() == [(None, None)]
            team_id = conn.execute(select(teams.c.id)).scalar_one()
            sweep_id = conn.execute(
                sweeps.insert()
                .values(
                    team_id=team_id,
                    name="s",
                    status="running",
                    definition={},
                    created_at=NOW,
                    updated_at=NOW,
                )
                .returning(sweeps.c.id)
            ).scalar_one()
            conn.execute(jobs.insert().values(job_row(team_id, sweep_id=sweep_id, sweep_trial=1)))
        with pytest.raises(IntegrityError), engine.begin() as conn:
            conn.execute(jobs.insert().values(job_row(team_id, sweep_id=sweep_id, sweep_trial=1)))
    finally:
        engine.dispose()


def test_downgrade_drops_the_sweeps_and_keeps_the_jobs(old_database):
    migrate(old_database)
    command.downgrade(alembic_config(old_database), "0004")
    engine = create_sync_engine(old_database)
    try:
        with engine.connect() as conn:
            inspector = inspect(conn)
            assert "sweeps" not in inspector.get_table_names()
            columns = {column["name"] for column in inspector.get_columns("jobs")}
            assert not {"sweep_id", "sweep_trial", "stop_reason"} & columns
            jobs = Table("jobs", MetaData(), autoload_with=conn)
            assert conn.execute(select(jobs.c.name)).scalars().all() == ["old"]
    finally:
        engine.dispose()
