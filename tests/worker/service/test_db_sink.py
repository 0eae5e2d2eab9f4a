"""The database sink on SQLite and Postgres: what a model writes is stored whatever bytes it
holds, and a write the database refuses for good stops the run instead of looping."""

from __future__ import annotations

import asyncio

from sqlalchemy import select

from app.jobs.store import claim_job, create_job
from app.samples.tables import Sample
from kernel.samples import KeptSample
from kernel.spec import JobSpec
from tests.app.conftest import small_spec
from worker.service.db_sink import DatabaseSink


async def started_job(session, key) -> int:
    job = (await create_job(session, key.team.id, JobSpec.model_validate(small_spec()))).job
    await claim_job(session, job.id, "w1", heartbeat_timeout=60)
    return job.id


async def test_text_with_nul_bytes_is_kept(sessions, session, key):
    job_id = await started_job(session, key)
    failures: list[BaseException] = []
    sink = DatabaseSink(sessions, job_id, "w1", print, lambda: None, failures.append)

    sink.samples(0, [KeptSample("Q\x00?", "a\x00b", ["a", "\x00", "b"], [0.1, 0.2, 0.3])])
    await sink.drain()

    assert failures == []
    stored = (await session.execute(select(Sample).where(Sample.job_id == job_id))).scalar_one()
    assert (stored.prompt, stored.completion, stored.tokens) == ("Q␀?", "a␀b", ["a", "␀", "b"])


async def test_a_write_refused_for_good_is_reported_and_ends_the_writes(sessions, session, key):
    job_id = await started_job(session, key)
    failures: list[BaseException] = []
    sink = DatabaseSink(sessions, job_id, "w1", print, lambda: None, failures.append)

    sink.checkpoint(1, "not-a-kind", "/p")  # a kind the store refuses
    sink.step(1, {"m": 1.0})
    await asyncio.wait_for(sink.drain(), 10)

    assert len(failures) == 1 and "not-a-kind" in str(failures[0])
