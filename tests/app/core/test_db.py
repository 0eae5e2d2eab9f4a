"""Database URLs, engines and migrations on SQLite and Postgres."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect, text
from sqlmodel import SQLModel

from app.core.config import Settings
from app.core.db import (
    alembic_config,
    async_url,
    create_db_engine,
    create_sync_engine,
    migrate,
    service_engine,
    sync_url,
)
from tests.support import POSTGRES_ADMIN_URL, temporary_postgres_database


@pytest.mark.parametrize(
    ("plain", "async_driver", "sync_driver"),
    [
        ("sqlite:////tmp/x/opd.db", "sqlite+aiosqlite", "sqlite"),
        ("postgresql://u@h:5432/opd", "postgresql+psycopg", "postgresql+psycopg"),
        ("postgres://u@h/opd", "postgresql+psycopg", "postgresql+psycopg"),
        ("postgresql+psycopg://u@h/opd", "postgresql+psycopg", "postgresql+psycopg"),
    ],
)
def test_plain_urls_get_their_drivers(plain, async_driver, sync_driver):
    assert async_url(plain).drivername == async_driver
    assert sync_url(plain).drivername == sync_driver
    assert async_url(plain).database == sync_url(plain).database


def test_other_databases_are_refused_with_a_hint():
    with pytest.raises(ValueError, match="use sqlite:///"):
        async_url("mysql://u:secret@h/db")


def test_migrations_build_exactly_the_models_schema(database_url):
    migrate(database_url)  # a second run is a no-op
    engine = create_sync_engine(database_url)
    try:
        with engine.connect() as conn:
            assert compare_metadata(MigrationContext.configure(conn), SQLModel.metadata) == []
            assert set(inspect(conn).get_table_names()) >= {
                "teams",
                "api_keys",
                "jobs",
                "step_metrics",
                "checkpoints",
                "events",
            }
    finally:
        engine.dispose()


def test_migrations_go_down_and_up_again(tmp_path):
    url = f"sqlite:///{tmp_path / 'opd.db'}"
    migrate(url)
    command.downgrade(alembic_config(url), "base")
    engine = create_sync_engine(url)
    try:
        with engine.connect() as conn:
            assert set(inspect(conn).get_table_names()) == {"alembic_version"}
        migrate(url)
        with engine.connect() as conn:
            assert "jobs" in inspect(conn).get_table_names()
    finally:
        engine.dispose()


async def test_sqlite_connections_use_wal_and_foreign_keys(tmp_path):
    engine = create_db_engine(f"sqlite:///{tmp_path / 'nested' / 'opd.db'}")
    try:
        async with engine.connect() as conn:
            assert (await conn.execute(text("PRAGMA journal_mode"))).scalar() == "wal"
            assert (await conn.execute(text("PRAGMA foreign_keys"))).scalar() == 1
            assert (await conn.execute(text("PRAGMA busy_timeout"))).scalar() >= 1000
    finally:
        await engine.dispose()


@pytest.fixture(params=["sqlite", "postgres"])
def fresh_database_url(request, tmp_path) -> Iterator[str]:
    """An empty database, not yet migrated."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'fresh.db'}"
        return
    with temporary_postgres_database() as url:
        yield url


def test_processes_migrating_at_once_do_not_collide(fresh_database_url):
    code = f"from app.core.db import migrate; migrate({fresh_database_url!r})"
    runs = [
        subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    for run in runs:
        _, stderr = run.communicate(timeout=120)
        assert run.returncode == 0, stderr
    engine = create_sync_engine(fresh_database_url)
    try:
        with engine.connect() as conn:
            assert compare_metadata(MigrationContext.configure(conn), SQLModel.metadata) == []
    finally:
        engine.dispose()


async def test_a_service_process_opens_no_more_postgres_connections_than_set(monkeypatch, tmp_path):
    """OPD_DB_POOL_SIZE + OPD_DB_MAX_OVERFLOW bound a process's connections (a fleet's
    processes must fit the server's max_connections): one more waits for a free one."""
    monkeypatch.setenv("OPD_DB_POOL_SIZE", "2")
    monkeypatch.setenv("OPD_DB_MAX_OVERFLOW", "1")
    engine = service_engine(Settings(home=tmp_path, database_url=POSTGRES_ADMIN_URL))
    try:
        held = [await engine.connect() for _ in range(3)]
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(engine.connect(), timeout=0.5)
        for conn in held:
            await conn.close()
        async with engine.connect() as conn:
            assert (await conn.execute(text("SELECT 1"))).scalar() == 1
    finally:
        await engine.dispose()
