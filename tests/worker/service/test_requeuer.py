"""The requeuer sends again what Redis lost, at one query and one round trip per pass; a
dead worker's job only once the process has seen the database for a heartbeat timeout."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import event, text, update
from sqlalchemy.exc import OperationalError

from app.core.db import create_db_engine, session_factory
from app.core.queue import JobQueue
from app.core.tables import utcnow
from app.jobs.dispatch import enqueue_job
from app.jobs.rows import get_job
from app.jobs.schemas import JobAction
from app.jobs.store import apply_action, claim_job, create_job
from app.jobs.tables import Job
from kernel.spec import JobSpec
from tests.app.conftest import CLOSED_REDIS_URL, small_spec
from tests.support import REDIS_URL
from worker.service.requeuer import requeue_lost
from worker.service.sight import DatabaseSight

AN_HOUR_AGO = utcnow() - timedelta(hours=1)


def watching() -> DatabaseSight:
    """A sight that has seen the database for an hour, up to now."""
    now = time.monotonic()
    return DatabaseSight(blind_after=30, seen_since=now - 3600, last_seen=now)


class CountingQueue(JobQueue):
    """The real queue, counting its Redis round trips (each `_call` is one)."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.round_trips: list[str] = []

    async def _call(self, operation: str, make: Callable[[Any], Awaitable[Any]]) -> Any:
        self.round_trips.append(operation)
        return await super()._call(operation, make)


async def new_jobs(session, key, count: int) -> list[int]:
    spec = JobSpec.model_validate(small_spec())
    return [(await create_job(session, key.team.id, spec)).job.id for _ in range(count)]


async def backdate(session, job_ids: list[int], **values: Any) -> None:
    """Make the jobs look as if they had waited (or beaten) an hour ago."""
    await session.execute(update(Job).where(Job.id.in_(job_ids)).values(**values))
    await session.commit()


async def test_waiting_jobs_with_their_messages_cost_one_query_and_one_round_trip(
    sessions, session, key, queue_name, settings
):
    queue = CountingQueue(REDIS_URL, queue_name)
    waiting = await new_jobs(session, key, 40)
    for job_id in waiting:
        assert await enqueue_job(session, queue, job_id)
    await backdate(session, waiting, updated_at=AN_HOUR_AGO)
    engine = sessions.kw["bind"].sync_engine
    async with sessions() as warm:
        await warm.execute(text("SELECT 1"))  # the dialect's first-connect queries are not ours
    statements: list[str] = []

    def count(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        statements.append(statement)

    event.listen(engine, "before_cursor_execute", count)
    queue.round_trips.clear()
    try:
        assert await requeue_lost(sessions, queue, settings, watching()) == []
    finally:
        event.remove(engine, "before_cursor_execute", count)
        await queue.close()
    assert len(statements) == 1, statements
    assert queue.round_trips == ["status"]


async def test_lost_messages_and_dead_workers_are_sent_again(
    sessions, session, key, queue, settings
):
    lost = await new_jobs(session, key, 3)
    kept, dead, alive, paused = await new_jobs(session, key, 4)
    assert await enqueue_job(session, queue, kept)
    for job_id in (dead, alive):
        await claim_job(session, job_id, "w1", heartbeat_timeout=60)
    await apply_action(session, paused, JobAction.pause)
    await backdate(session, [*lost, kept, paused], updated_at=AN_HOUR_AGO)
    await backdate(session, [dead], heartbeat_at=AN_HOUR_AGO)

    sent = await requeue_lost(sessions, queue, settings, watching())

    assert sent == sorted([*lost, dead])
    for job_id in sent:
        job = await get_job(session, job_id)
        assert await queue.is_pending(job_id, job.enqueue_count), "a fresh message waits"
    assert await requeue_lost(sessions, queue, settings, watching()) == [dead], (
        "queued ones have messages now"
    )


async def test_without_redis_a_sweep_sends_and_counts_nothing(sessions, session, key, settings):
    waiting = await new_jobs(session, key, 2)
    await backdate(session, waiting, updated_at=AN_HOUR_AGO)
    down = JobQueue(CLOSED_REDIS_URL, "q", 1)
    assert await requeue_lost(sessions, down, settings, watching()) == []
    assert [(await get_job(session, job_id)).enqueue_count for job_id in waiting] == [0, 0]


async def test_a_dead_workers_job_waits_until_the_database_was_seen_for_a_timeout(
    sessions, session, key, queue, settings
):
    """After an outage (a contact that failed), a stale heartbeat says nothing: a queued
    job is sent, an active one is not, until the sight has watched a whole timeout."""
    queued, active = await new_jobs(session, key, 2)
    await claim_job(session, active, "w1", heartbeat_timeout=60)
    await backdate(session, [queued], updated_at=AN_HOUR_AGO)
    await backdate(session, [active], heartbeat_at=AN_HOUR_AGO)
    sight = watching()
    sight.missed()

    assert await requeue_lost(sessions, queue, settings, sight) == [queued]
    assert sight.last_seen is not None, "the pass saw the database"
    assert await requeue_lost(sessions, queue, settings, sight) == []
    sight.seen_since = time.monotonic() - settings.heartbeat_timeout
    assert await requeue_lost(sessions, queue, settings, sight) == [active]


async def test_a_pass_that_cannot_reach_the_database_blinds_the_sight(queue, settings):
    engine = create_db_engine("postgresql://postgres@127.0.0.1:1/none")
    sight = watching()
    with pytest.raises(OperationalError):
        await requeue_lost(session_factory(engine), queue, settings, sight)
    await engine.dispose()
    assert (sight.seen_since, sight.last_seen) == (None, None)
