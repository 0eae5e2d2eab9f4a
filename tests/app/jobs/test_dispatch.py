"""The requeuer's candidates: active jobs gone silent and jobs queued too long."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import update

from app.core.tables import utcnow
from app.jobs.dispatch import count_resends, next_enqueue_count, requeue_candidates
from app.jobs.store import claim_job, complete_job, create_job
from app.jobs.tables import Job
from kernel.spec import JobSpec
from tests.app.conftest import small_spec


async def test_orphans_are_stale_active_jobs_and_long_queued_ones(session, key):
    spec = JobSpec.model_validate(small_spec())
    fresh, stale, waiting, finished = [
        (await create_job(session, key.team.id, spec)).job.id for _ in range(4)
    ]
    for job_id in (fresh, stale, finished):
        await claim_job(session, job_id, "w1", heartbeat_timeout=60)
    await complete_job(session, finished, "w1", "/w")
    an_hour_ago = utcnow() - timedelta(hours=1)
    await session.execute(update(Job).where(Job.id == stale).values(heartbeat_at=an_hour_ago))
    await session.execute(update(Job).where(Job.id == waiting).values(updated_at=an_hour_ago))
    await session.commit()
    orphans = {c.id for c in await requeue_candidates(session, heartbeat_timeout=60, queued_for=60)}
    assert {stale, waiting} <= orphans
    assert not {fresh, finished} & orphans


async def test_a_send_is_counted_only_if_nobody_got_there_first(session, key):
    spec = JobSpec.model_validate(small_spec())
    lost, resent, dead, taken = [
        (await create_job(session, key.team.id, spec)).job.id for _ in range(4)
    ]
    for job_id in (dead, taken):
        await claim_job(session, job_id, "w1", heartbeat_timeout=60)
    an_hour_ago = utcnow() - timedelta(hours=1)
    await session.execute(
        update(Job).where(Job.id.in_([lost, resent])).values(updated_at=an_hour_ago)
    )
    await session.execute(
        update(Job).where(Job.id.in_([dead, taken])).values(heartbeat_at=an_hour_ago)
    )
    await session.commit()
    listed = [
        c
        for c in await requeue_candidates(session, heartbeat_timeout=60, queued_for=60)
        if c.id in {lost, resent, dead, taken}
    ]
    assert len(listed) == 4
    # meanwhile the API sent `resent` again and a worker took `taken` over
    await next_enqueue_count(session, resent)
    await session.execute(update(Job).where(Job.id == taken).values(heartbeat_at=utcnow()))
    await session.commit()

    assert await count_resends(session, listed, heartbeat_timeout=60) == [(lost, 1), (dead, 1)]
