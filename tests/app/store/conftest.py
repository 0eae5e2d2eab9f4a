"""A stored job to act on, and its timeline."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from app.jobs.store import create_job
from app.jobs.tables import Event, Job
from kernel.spec import JobSpec
from tests.app.conftest import small_spec


@pytest.fixture
async def job(session, key) -> Job:
    return (await create_job(session, key.team.id, JobSpec.model_validate(small_spec()))).job


async def events_of(session, job_id: int) -> list[str]:
    query = select(Event.message).where(Event.job_id == job_id).order_by(Event.id)
    rows = await session.execute(query)
    return list(rows.scalars())
