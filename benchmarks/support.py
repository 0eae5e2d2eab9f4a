"""What both benchmarks need: a throwaway Postgres database, a private arq queue, free
ports and percentiles. (Scripts run from this folder, so they import it as `support`.)"""

from __future__ import annotations

import math
import subprocess
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import httpx
import psycopg
from redis import Redis
from sqlalchemy import make_url

from opd.serve import free_port

__all__ = ["free_port", "fresh_database", "percentile", "private_queue", "wait_until_healthy"]


def percentile(values: Sequence[float], fraction: float) -> float | None:
    """Nearest-rank percentile; None when there are no values."""
    ordered = sorted(values)
    if not ordered:
        return None
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


@contextmanager
def fresh_database(admin_url: str, prefix: str) -> Iterator[str]:
    """A new, uniquely named Postgres database, dropped afterwards (connections and all)."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield make_url(admin_url).set(database=name).render_as_string(hide_password=False)
    finally:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


@contextmanager
def private_queue(redis_url: str, prefix: str) -> Iterator[str]:
    """A unique arq queue name; every Redis key naming it is deleted afterwards. Redis is
    pinged first, so a missing server fails now rather than after the run."""
    name = f"{prefix}-{uuid.uuid4().hex[:12]}"
    with Redis.from_url(redis_url, socket_connect_timeout=2) as redis:
        redis.ping()
    try:
        yield name
    finally:
        with Redis.from_url(redis_url) as redis:
            keys = list(redis.scan_iter(match=f"*{name}*", count=1000))
            if keys:
                redis.delete(*keys)


def wait_until_healthy(
    url: str, process: subprocess.Popen, timeout: float, what: str, path: str = "/healthz"
) -> None:
    """Poll `url` + `path` until it answers; RuntimeError naming `what` if the process
    exits or `timeout` seconds pass first."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(f"{url}{path}", timeout=1).is_success:
                return
        except httpx.TransportError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not start")
        time.sleep(0.2)
