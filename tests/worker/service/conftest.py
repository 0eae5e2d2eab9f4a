"""The service-side fixtures (real Redis, keys, sessions), on a fresh migrated database of
each kind per test: the sweeper looks at every job in the database."""

from collections.abc import Iterator

import pytest

from app.core.db import migrate
from tests.app.conftest import (  # noqa: F401 (fixtures)
    key,
    make_key,
    queue,
    queue_name,
    redis,
    session,
    sessions,
    settings,
)
from tests.support import temporary_postgres_database


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request: pytest.FixtureRequest, tmp_path) -> Iterator[str]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'opd.db'}"
        migrate(url)
        yield url
        return
    with temporary_postgres_database() as url:
        migrate(url)
        yield url
