"""Migration 0019 on a database filled at 0018: every table whose ids a team names keeps
its rows and ids, and a deleted last row's id is not given to the next row (SQLite gave it
again before); the downgrade keeps the rows too."""

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
    """A database at 0018 with two teams."""
    with migrated_database(request.param, tmp_path, fill) as url:
        yield url


def fill(url: str) -> None:
    migrate(url, "0018")
    for name in ("alpha", "beta"):
        add_team(url, name)


def add_team(url: str, name: str) -> int:
    engine = create_sync_engine(url)
    try:
        with engine.begin() as conn:
            teams = Table("teams", MetaData(), autoload_with=conn)
            return conn.execute(
                teams.insert().values(name=name, created_at=NOW).returning(teams.c.id)
            ).scalar_one()
    finally:
        engine.dispose()


def teams_of(url: str, delete: str | None = None) -> dict[str, int]:
    engine = create_sync_engine(url)
    try:
        with engine.begin() as conn:
            teams = Table("teams", MetaData(), autoload_with=conn)
            if delete is not None:
                conn.execute(teams.delete().where(teams.c.name == delete))
            return {name: id_ for name, id_ in conn.execute(select(teams.c.name, teams.c.id))}
    finally:
        engine.dispose()


def test_rows_keep_their_ids_and_a_deleted_last_id_is_not_given_again(old_database):
    migrate(old_database)
    assert teams_of(old_database) == {"alpha": 1, "beta": 2}
    teams_of(old_database, delete="beta")
    assert add_team(old_database, "gamma") == 3

    command.downgrade(alembic_config(old_database), "0018")
    assert teams_of(old_database) == {"alpha": 1, "gamma": 3}
    migrate(old_database)
    assert teams_of(old_database) == {"alpha": 1, "gamma": 3}
