"""Helpers shared by the test folders: the real Postgres and Redis of the machine."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from sqlalchemy import make_url

POSTGRES_ADMIN_URL = os.environ.get(
    "OPD_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)
REDIS_URL = os.environ.get("OPD_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")


@contextmanager
def temporary_postgres_database() -> Iterator[str]:
    """A new, uniquely named, empty Postgres database, dropped afterwards."""
    name = f"opd_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield make_url(POSTGRES_ADMIN_URL).set(database=name).render_as_string(False)
    finally:
        with psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
