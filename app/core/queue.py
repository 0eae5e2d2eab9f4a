"""Hands job ids to the workers through arq, by task name: the API never imports `worker`.

The database owns job state and Redis only carries "run job X" messages, so losing a
message is survivable (the requeuer re-enqueues from the database) but losing a job is
not: the job row is committed before its message is sent, and a send that fails leaves
the job queued with the reason written on it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar
from urllib.parse import urlsplit

from arq.connections import ArqRedis, RedisSettings, create_pool
from arq.jobs import in_progress_key_prefix, result_key_prefix
from redis.exceptions import RedisError

from app.core.telemetry import QUEUE_ERRORS

TASK_NAME = "run_job"

log = logging.getLogger(__name__)

T = TypeVar("T")


class QueueUnavailable(Exception):
    """Redis is not configured or does not answer; the message says which."""


def redis_address(url: str | None) -> str:
    """Where a Redis URL points, without its credentials (messages reach API clients)."""
    parts = urlsplit(url or "")
    return parts.path if parts.scheme == "unix" else f"{parts.hostname}:{parts.port or 6379}"


class JobQueue:
    """An arq connection made on first use and remade after a failure, so the API starts
    (and keeps serving) while Redis is away."""

    def __init__(self, redis_url: str | None, queue_name: str, timeout: float = 2.0) -> None:
        self.redis_url = redis_url
        self.queue_name = queue_name
        self.timeout = timeout
        self._pool: ArqRedis | None = None

    async def _connect(self) -> ArqRedis:
        if self.redis_url is None:
            raise QueueUnavailable("no Redis is configured (set OPD_REDIS_URL)")
        if self._pool is None:
            settings = RedisSettings.from_dsn(self.redis_url)
            settings.conn_timeout = self.timeout  # type: ignore[assignment]
            settings.conn_retries = 0
            self._pool = await create_pool(settings, default_queue_name=self.queue_name)
        return self._pool

    async def _call(self, operation: str, make: Callable[[ArqRedis], Awaitable[T]]) -> T:
        try:
            pool = await asyncio.wait_for(self._connect(), self.timeout)
            return await asyncio.wait_for(make(pool), self.timeout)
        except (OSError, RedisError, TimeoutError) as error:
            QUEUE_ERRORS.labels(operation).inc()
            await self.close()
            reason = str(error).rstrip(".") or type(error).__name__
            raise QueueUnavailable(
                f"Redis at {redis_address(self.redis_url)} did not answer ({operation}): {reason}"
            ) from error

    async def connection(self) -> ArqRedis:
        """The arq connection, for callers with waits of their own (raises QueueUnavailable)."""
        return await self._call("connect", lambda pool: asyncio.sleep(0, result=pool))

    def arq_job_id(self, job_id: int, enqueue_count: int) -> str:
        """arq's id for the `enqueue_count`-th send of a job: never reused, even after an
        abort, nor shared with another service's queue on the same Redis."""
        return f"{self.queue_name}:job-{job_id}-{enqueue_count}"

    async def push(self, job_id: int, enqueue_count: int) -> None:
        """Send "run job `job_id`" (raises QueueUnavailable)."""
        arq_id = self.arq_job_id(job_id, enqueue_count)
        await self._call(
            "enqueue", lambda pool: pool.enqueue_job(TASK_NAME, job_id, _job_id=arq_id)
        )

    async def pending(self, sends: Sequence[tuple[int, int]]) -> set[int]:
        """The jobs among (job id, enqueue count) pairs whose message still waits in (or
        runs from) the queue, as arq's job status tells it: one round trip for all."""
        if not sends:
            return set()
        arq_ids = [self.arq_job_id(job_id, count) for job_id, count in sends]

        async def statuses(pool: ArqRedis) -> list[Any]:
            async with pool.pipeline(transaction=False) as pipe:
                for arq_id in arq_ids:
                    pipe.exists(result_key_prefix + arq_id)
                    pipe.exists(in_progress_key_prefix + arq_id)
                    pipe.zscore(self.queue_name, arq_id)
                return await pipe.execute()

        answers = iter(await self._call("status", statuses))
        per_job = zip(sends, answers, answers, answers, strict=True)
        return {
            job_id
            for (job_id, _), done, running, score in per_job
            if not done and (running or score)
        }

    async def is_pending(self, job_id: int, enqueue_count: int) -> bool:
        """Whether the job's latest message still waits in (or runs from) the queue."""
        return job_id in await self.pending([(job_id, enqueue_count)])

    async def length(self) -> int:
        """Messages waiting in the queue (not yet taken by a worker)."""
        return await self._call("length", lambda pool: pool.zcard(self.queue_name))

    async def ping(self) -> None:
        await self._call("ping", lambda pool: pool.ping())

    async def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.aclose()
