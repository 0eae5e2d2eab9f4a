"""Migration 0002 summarises the step rows a database filled at revision 0001 holds."""

from __future__ import annotations

import math
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from alembic import command
from sqlalchemy import MetaData, Table, func, inspect, select

from app.core.db import (
    alembic_config,
    create_db_engine,
    create_sync_engine,
    migrate,
    session_factory,
)
from app.core.tables import finite_or_none
from app.curves.store import CurveQuery, read_curves
from app.jobs.rows import get_job
from app.jobs.store import claim_job, create_job
from app.records.store import record_step
from kernel.spec import JobSpec
from tests.app.conftest import small_spec
from tests.app.curves.test_block_store import stored as stored_summaries
from tests.support import temporary_postgres_database

NOW = datetime(2026, 11, 1, tzinfo=UTC)


def step_metrics(step: int) -> dict[str, float]:
    metrics = {"kl": 40.0 if step == 77 else 1.0 + step % 5 / 10}
    if step % 10 == 0:
        metrics["eval"] = math.nan if step == 20 else step / 1000
    return metrics


STEPS = (150, 3, 0)  # steps recorded before the upgrade by each of three jobs


@pytest.fixture(params=["sqlite", "postgres"])
def old_database(request, tmp_path) -> Iterator[tuple[str, list[int]]]:
    """A database at revision 0001, filled as the service filled it before 0002, and
    its jobs' ids."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'old.db'}"
        yield url, fill(url)
        return
    with temporary_postgres_database() as url:
        yield url, fill(url)


def fill(url: str) -> list[int]:
    migrate(url, "0001")
    engine = create_sync_engine(url)
    try:
        with engine.begin() as conn:
            tables = MetaData()
            teams, jobs, step_rows = (
                Table(name, tables, autoload_with=conn)
                for name in ("teams", "jobs", "step_metrics")
            )
            team = {"name": "old", "created_at": NOW}
            team_id = conn.execute(teams.insert().values(team).returning(teams.c.id)).scalar()
            job = {
                "team_id": team_id, "name": "old", "status": "running", "spec": small_spec(),
                "created_at": NOW, "updated_at": NOW, "steps_done": 0, "total_steps": 200,
                "attempts": 1, "enqueue_count": 1, "worker_id": "w-old", "heartbeat_at": NOW,
            }  # fmt: skip
            ids = [
                conn.execute(jobs.insert().values(job).returning(jobs.c.id)).scalar_one()
                for _ in STEPS
            ]
            rows = [
                {"job_id": job_id, "step": step, "metrics": stored(step_metrics(step))}
                for job_id, steps in zip(ids, STEPS, strict=True)
                for step in range(steps)
            ]
            conn.execute(step_rows.insert(), [row | {"recorded_at": NOW} for row in rows])
    finally:
        engine.dispose()
    return ids


def stored(metrics: dict[str, float]) -> dict[str, float | None]:
    """As revision 0001's record_step stored them: a NaN as null."""
    return {key: finite_or_none(value) for key, value in metrics.items()}


async def test_upgrade_summarises_old_rows_as_recording_them_would(old_database):
    url, (long_job, short_job, _) = old_database
    migrate(url)
    engine = create_db_engine(url)
    try:
        async with session_factory(engine)() as session:
            migrated = await stored_summaries(session, long_job)
            assert await stored_summaries(session, short_job) == {}, "3 steps: its block is open"
            # the same steps recorded one by one on the upgraded schema
            team_id = (await get_job(session, long_job)).team_id
            spec = JobSpec.model_validate(small_spec(loop={"steps": 200}))
            again = (await create_job(session, team_id, spec)).job.id
            await claim_job(session, again, "w-new", heartbeat_timeout=60)
            for step in range(STEPS[0]):
                await record_step(session, again, "w-new", step, step_metrics(step))
            assert migrated == await stored_summaries(session, again)
            assert ("kl", 64, 0) in migrated and ("eval", 16, 8) in migrated

            query = CurveQuery(("kl", "eval"), None, None, max_points=12)
            curves = (await read_curves(session, long_job, query)).curves
            kl = curves["kl"]
            assert kl.steps[0] == 0 and kl.steps[-1] == 149
            assert kl.values[kl.steps.index(77)] == 40.0, "the spike is kept"
            assert curves["eval"].steps[0] == 0 and curves["eval"].steps[-1] == 140
    finally:
        await engine.dispose()


def test_downgrade_drops_the_summaries_and_keeps_the_rows(old_database):
    url, _ = old_database
    migrate(url)
    command.downgrade(alembic_config(url), "0001")
    engine = create_sync_engine(url)
    try:
        with engine.connect() as conn:
            assert "metric_summaries" not in inspect(conn).get_table_names()
            step_rows = Table("step_metrics", MetaData(), autoload_with=conn)
            count = conn.execute(select(func.count()).select_from(step_rows)).scalar()
            assert count == sum(STEPS)
    finally:
        engine.dispose()
