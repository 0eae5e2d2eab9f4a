"""Database engines, sessions and migrations for SQLite and Postgres alike.

Settings hold plain URLs (`sqlite:///opd.db`, `postgresql://user@host/db`); the async
driver (aiosqlite, psycopg) is chosen here, so nobody else spells a driver name.
"""

from __future__ import annotations

import fcntl
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

from alembic import command
from alembic.config import Config
from sqlalchemy import URL, Engine, create_engine, event, make_url, text
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)

from app.core.config import POSTGRES_MAX_OVERFLOW, POSTGRES_POOL_SIZE, Settings

MIGRATIONS_DIR = Path(__file__).resolve().parents[2] / "migrations"
SQLITE_BUSY_TIMEOUT_MS = 30_000
POSTGRES_CONNECT_TIMEOUT_S = 10


def _parse(database_url: str) -> URL:
    url = make_url(database_url)
    backend = url.get_backend_name()
    if backend == "sqlite":
        return url
    if backend in ("postgresql", "postgres"):
        return url.set(drivername="postgresql+psycopg")
    raise ValueError(
        f"unsupported database URL {url.render_as_string(hide_password=True)!r}: "
        "use sqlite:///path/to/opd.db or postgresql://user@host/dbname"
    )


def async_url(database_url: str) -> URL:
    """The URL with the async driver: aiosqlite for SQLite, psycopg for Postgres."""
    url = _parse(database_url)
    return url.set(drivername="sqlite+aiosqlite") if url.get_backend_name() == "sqlite" else url


def sync_url(database_url: str) -> URL:
    """The URL with the blocking driver (migrations): pysqlite or psycopg."""
    url = _parse(database_url)
    return url.set(drivername="sqlite") if url.get_backend_name() == "sqlite" else url


def _is_sqlite_file(url: URL) -> bool:
    return url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:")


def _make_sqlite_dir(url: URL) -> None:
    if _is_sqlite_file(url):
        Path(str(url.database)).parent.mkdir(parents=True, exist_ok=True)


def _sqlite_pragmas(foreign_keys: bool) -> Callable[[Any, Any], None]:
    """WAL lets readers (the API) run beside a writer (a worker); busy_timeout makes a
    second writer wait instead of failing."""

    def on_connect(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute(f"PRAGMA foreign_keys={'ON' if foreign_keys else 'OFF'}")
        cursor.close()

    return on_connect


def create_db_engine(
    database_url: str,
    pool_size: int = POSTGRES_POOL_SIZE,
    max_overflow: int = POSTGRES_MAX_OVERFLOW,
) -> AsyncEngine:
    """An async engine for the API or the worker (one per process; it holds the pool, whose
    size matters on Postgres only)."""
    url = async_url(database_url)
    if url.get_backend_name() == "sqlite":
        _make_sqlite_dir(url)
        engine = create_async_engine(url)
        event.listen(engine.sync_engine, "connect", _sqlite_pragmas(foreign_keys=True))
        return engine
    # pre-ping turns a connection the server dropped (restart, failover) into a fresh one.
    return create_async_engine(
        url,
        pool_size=pool_size,
        max_overflow=max_overflow,
        pool_pre_ping=True,
        connect_args={"connect_timeout": POSTGRES_CONNECT_TIMEOUT_S},
    )


def service_engine(settings: Settings) -> AsyncEngine:
    """The engine of a service process (API, worker, sweep controller), its pool as set."""
    return create_db_engine(settings.database_url, settings.db_pool_size, settings.db_max_overflow)


def create_sync_engine(database_url: str) -> Engine:
    """A blocking engine for migrations; SQLite foreign keys stay off for batch rebuilds."""
    url = sync_url(database_url)
    _make_sqlite_dir(url)
    engine = create_engine(url)
    if url.get_backend_name() == "sqlite":
        event.listen(engine, "connect", _sqlite_pragmas(foreign_keys=False))
    return engine


def session_factory(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    """Sessions whose objects stay readable after commit (responses are built after it)."""
    return async_sessionmaker(engine, expire_on_commit=False)


@asynccontextmanager
async def standalone_session(database_url: str) -> AsyncIterator[AsyncSession]:
    """A session on an engine of its own, disposed afterwards: for one-off commands such
    as `opd keys create`."""
    engine = create_db_engine(database_url)
    try:
        async with session_factory(engine)() as session:
            yield session
    finally:
        await engine.dispose()


def alembic_config(database_url: str, settings: Settings | None = None) -> Config:
    """Alembic's configuration for this project's migrations against `database_url`; the
    settings are those of the service (a migration that encrypts reads its keys there),
    by default the process's own."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.attributes["database_url"] = database_url
    config.attributes["settings"] = settings
    return config


def migrate(database_url: str, revision: str = "head", settings: Settings | None = None) -> None:
    """Upgrade the database to `revision` (blocking). Safe to run again, and from several
    processes at once: Postgres serializes them with an advisory lock (migrations/env.py),
    SQLite with a lock file beside the database."""
    url = sync_url(database_url)
    config = alembic_config(database_url, settings)
    if not _is_sqlite_file(url):
        command.upgrade(config, revision)
        return
    _make_sqlite_dir(url)
    with open(f"{url.database}.migrate-lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        command.upgrade(config, revision)


async def commit_or_flush(session: AsyncSession, commit: bool) -> None:
    """End an action's writes: commit them, or flush them for `record_audit` to commit with
    the action's row (commit=False)."""
    await (session.commit() if commit else session.flush())


T = TypeVar("T")


async def lock_team(session: AsyncSession, space: int, team_id: int) -> None:
    """Hold the team's lock of `space` (a feature's constant) until the transaction ends
    (Postgres's advisory lock); SQLite has one writer, so the callers' first statement is
    a write, which holds it."""
    if (await session.connection()).dialect.name == "postgresql":
        await session.execute(
            text("SELECT pg_advisory_xact_lock(:space, :team)"), {"space": space, "team": team_id}
        )


def insert_for(dialect: str) -> Any:
    """The INSERT construct that can say ON CONFLICT on the database (Postgres or SQLite)."""
    return postgresql.insert if dialect == "postgresql" else sqlite.insert


def detach(session: AsyncSession, obj: T) -> T:
    """Returned objects are snapshots: a later rollback in the session cannot expire them
    (reading an expired attribute would need IO the caller cannot do)."""
    session.expunge(obj)
    return obj
