"""Migration 0003 gives the jobs a database filled at revision 0002 holds their summaries,
as recording their steps on the new schema would, and adds the samples table."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from alembic import command
from sqlalchemy import MetaData, Table, inspect

from app.core.db import (
    alembic_config,
    create_db_engine,
    create_sync_engine,
    migrate,
    session_factory,
)
from app.jobs.rows import get_job
from app.jobs.store import claim_job, create_job
from app.records.store import record_step
from kernel.spec import JobSpec
from tests.app.conftest import small_spec
from tests.support import temporary_postgres_database

NOW = datetime(2026, 11, 1, tzinfo=UTC)


def metrics(step: int) -> dict[str, float]:
    row = {"opd/reverse_kl_mean": 2.0 - step / 10, "trainer/loss_sum": 1.0}
    if step % 5 == 0:
        row["eval/accuracy"] = step / 100
    return row


@pytest.fixture(params=["sqlite", "postgres"])
def old_database(request, tmp_path) -> Iterator[tuple[str, int]]:
    """A database at revision 0002 with one job of 12 recorded steps, and that job's id."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'old.db'}"
        yield url, fill(url)
        return
    with temporary_postgres_database() as url:
        yield url, fill(url)


def fill(url: str) -> int:
    migrate(url, "0002")
    engine = create_sync_engine(url)
    try:
        with engine.begin() as conn:
            tables = MetaData()
            teams, jobs, steps = (
                Table(name, tables, autoload_with=conn)
                for name in ("teams", "jobs", "step_metrics")
            )
            team_id = conn.execute(
                teams.insert().values(name="old", created_at=NOW).returning(teams.c.id)
            ).scalar_one()
            job = {
                "team_id": team_id, "name": "old", "status": "running", "spec": small_spec(),
                "created_at": NOW, "updated_at": NOW, "steps_done": 12, "total_steps": 20,
                "attempts": 1, "enqueue_count": 1, "worker_id": "w-old", "heartbeat_at": NOW,
            }  # fmt: skip
            job_id = conn.execute(jobs.insert().values(job).returning(jobs.c.id)).scalar_one()
            conn.execute(
                steps.insert(),
                [
                    {"job_id": job_id, "step": s, "metrics": metrics(s), "recorded_at": NOW}
                    for s in range(12)
                ],
            )
    finally:
        engine.dispose()
    return job_id


async def test_upgrade_fills_each_jobs_summary_as_recording_would(old_database):
    url, old_job = old_database
    migrate(url)
    engine = create_db_engine(url)
    try:
        async with session_factory(engine)() as session:
            migrated = await get_job(session, old_job)
            again = (
                await create_job(session, migrated.team_id, JobSpec.model_validate(small_spec()))
            ).job.id
            await claim_job(session, again, "w-new", heartbeat_timeout=60)
            for step in range(12):
                await record_step(session, again, "w-new", step, metrics(step))
            recorded = await get_job(session, again)
    finally:
        await engine.dispose()
    assert migrated.metric_ends == recorded.metric_ends
    assert migrated.summary.reverse_kl.first == 2.0
    assert migrated.summary.eval_accuracy.last == 0.1


def test_downgrade_drops_the_samples_and_the_summaries(old_database):
    url, _ = old_database
    migrate(url)
    command.downgrade(alembic_config(url), "0002")
    engine = create_sync_engine(url)
    try:
        with engine.connect() as conn:
            inspector = inspect(conn)
            assert "samples" not in inspector.get_table_names()
            assert "metric_ends" not in {c["name"] for c in inspector.get_columns("jobs")}
    finally:
        engine.dispose()
