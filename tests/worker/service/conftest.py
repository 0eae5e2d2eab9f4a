"""The service-side fixtures (real Redis, keys, sessions), on a fresh migrated database of
each kind per test: the requeuer looks at every job in the database."""

from collections.abc import Iterator

import pytest

from tests.app.conftest import (  # noqa: F401 (fixtures)
    box,
    key,
    make_key,
    queue,
    queue_name,
    redis,
    session,
    sessions,
    settings,
)
from tests.support import migrated_database
from tests.worker.service.quick_api import api, trained  # noqa: F401 (fixtures)


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request: pytest.FixtureRequest, tmp_path) -> Iterator[str]:
    with migrated_database(request.param, tmp_path) as url:
        yield url
