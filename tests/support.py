"""Helpers shared by the test folders: the real Postgres and Redis of the machine."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
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


def assert_close(actual: Any, expected: Any, *, rtol: float = 1e-5, what: str = "") -> None:
    """`actual` equals `expected` up to float rounding, judged on the whole tensor:
    ||actual - expected|| <= rtol * ||expected||. Element-wise tolerances fail on tiny
    entries whose last bits differ between CPUs (AVX-512 or not, Intel or AMD)."""
    a = np.asarray(to_numbers(actual), dtype=np.float64)
    b = np.asarray(to_numbers(expected), dtype=np.float64)
    assert a.shape == b.shape, f"{what}: shape {a.shape} != {b.shape}"
    error = float(np.linalg.norm(a - b))
    scale = float(np.linalg.norm(b))
    assert error <= rtol * scale, (
        f"{what}: |actual - expected| = {error:.3g} > {rtol:g} * |expected| = {rtol * scale:.3g} "
        f"(largest element difference {float(np.abs(a - b).max(initial=0.0)):.3g})"
    )


def to_numbers(value: Any) -> Any:
    """A tensor (any device or dtype), array or nested list as plain numbers."""
    if hasattr(value, "detach"):
        return value.detach().double().cpu().numpy()
    return value
