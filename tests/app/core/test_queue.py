"""Sending jobs to the workers through a real Redis, by task name."""

from __future__ import annotations

import pytest
from arq.connections import RedisSettings, create_pool

from app.core.queue import TASK_NAME, JobQueue, QueueUnavailable
from app.jobs.dispatch import enqueue_job
from app.jobs.rows import get_job
from app.jobs.schemas import JobAction
from app.jobs.store import apply_action, create_job
from kernel.spec import JobSpec
from tests.app.conftest import CLOSED_REDIS_URL, small_spec
from tests.support import REDIS_URL


@pytest.fixture
async def job_id(session, key) -> int:
    return (await create_job(session, key.team.id, JobSpec.model_validate(small_spec()))).job.id


async def queued_jobs(queue_name: str):
    pool = await create_pool(RedisSettings.from_dsn(REDIS_URL))
    try:
        return await pool.queued_jobs(queue_name=queue_name)
    finally:
        await pool.aclose()


async def test_a_job_is_sent_by_task_name_with_a_fresh_id_each_time(
    session, queue, queue_name, job_id
):
    assert await enqueue_job(session, queue, job_id)
    assert await enqueue_job(session, queue, job_id)
    sent = sorted(await queued_jobs(queue_name), key=lambda job: job.job_id)
    assert [(job.function, job.args) for job in sent] == [(TASK_NAME, (job_id,))] * 2
    assert [job.job_id for job in sent] == [
        queue.arq_job_id(job_id, 1),
        queue.arq_job_id(job_id, 2),
    ]
    assert queue_name in sent[0].job_id, "ids never collide with another queue's"
    assert (await get_job(session, job_id)).enqueue_count == 2
    assert await queue.is_pending(job_id, 2)
    assert not await queue.is_pending(job_id, 3)


async def test_a_job_that_should_not_run_is_not_sent(session, queue, queue_name, job_id):
    await apply_action(session, job_id, JobAction.cancel)
    assert not await enqueue_job(session, queue, job_id)
    assert await queued_jobs(queue_name) == []


async def test_unreachable_redis_leaves_the_job_queued_with_a_reason(
    session, queue, queue_name, job_id
):
    down = JobQueue(CLOSED_REDIS_URL, queue_name, timeout=1)
    assert not await enqueue_job(session, down, job_id)
    job = await get_job(session, job_id)
    assert job.status == "queued"
    assert "127.0.0.1:1 did not answer" in job.queue_reason
    assert "enqueued when Redis is back" in job.queue_reason

    assert await enqueue_job(session, queue, job_id)
    assert (await get_job(session, job_id)).queue_reason is None
    assert len(await queued_jobs(queue_name)) == 1


async def test_no_redis_configured_is_a_clear_error():
    with pytest.raises(QueueUnavailable, match="OPD_REDIS_URL"):
        await JobQueue(None, "q").ping()


async def test_the_reason_never_shows_redis_credentials():
    with pytest.raises(QueueUnavailable) as error:
        await JobQueue("redis://:s3cret@127.0.0.1:1/0", "q", timeout=1).ping()
    assert "s3cret" not in str(error.value)
    assert "127.0.0.1:1" in str(error.value)
