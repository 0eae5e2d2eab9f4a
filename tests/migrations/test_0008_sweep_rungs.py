"""Migration 0008 on a database filled at revision 0007: the judgments table appears, a
trial of a sweep judged on a metric no summary keeps gets that metric's ends from its step
rows (others are left as they were), and the downgrade drops the table."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from alembic import command
from sqlalchemy import MetaData, Table, inspect, select

from app.core.db import alembic_config, create_sync_engine, migrate
from tests.migrations.test_0007_sweeps import job_row
from tests.support import migrated_database

NOW = datetime(2026, 12, 5, tzinfo=UTC)
KL = "opd/reverse_kl_mean"


@pytest.fixture(params=["sqlite", "postgres"])
def old_database(request, tmp_path) -> Iterator[str]:
    """At revision 0007: a sweep on `custom/score` with one trial of four steps (the
    metric at steps 1 and 2 only), a sweep on the reverse KL with one, and a lone job."""
    with migrated_database(request.param, tmp_path, fill) as url:
        yield url


def fill(url: str) -> None:
    migrate(url, "0007")
    engine = create_sync_engine(url)
    try:
        with engine.begin() as conn:
            tables = MetaData()
            teams, jobs, sweeps, steps = (
                Table(name, tables, autoload_with=conn)
                for name in ("teams", "jobs", "sweeps", "step_metrics")
            )
            team_id = conn.execute(
                teams.insert().values(name="old", created_at=NOW).returning(teams.c.id)
            ).scalar_one()
            kl_ends = {KL: [0, 2.0, 3, 1.0]}
            for metric in ("custom/score", KL):
                sweep_id = conn.execute(
                    sweeps.insert()
                    .values(
                        team_id=team_id,
                        name=metric,
                        status="running",
                        definition={"metric": {"name": metric, "goal": "maximize"}},
                        created_at=NOW,
                        updated_at=NOW,
                    )
                    .returning(sweeps.c.id)
                ).scalar_one()
                row = job_row(team_id, sweep_id=sweep_id, sweep_trial=1, metric_ends=kl_ends)
                job_id = conn.execute(jobs.insert().values(row).returning(jobs.c.id)).scalar_one()
                for at in range(4):
                    metrics = {KL: 2.0 - at / 3} | (
                        {"custom/score": at / 10} if at in (1, 2) else {}
                    )
                    conn.execute(
                        steps.insert().values(
                            job_id=job_id, step=at, metrics=metrics, recorded_at=NOW
                        )
                    )
            conn.execute(jobs.insert().values(job_row(team_id, metric_ends=kl_ends)))
    finally:
        engine.dispose()


def test_upgrade_keeps_a_custom_sweep_metric_on_its_trials(old_database):
    migrate(old_database)
    engine = create_sync_engine(old_database)
    try:
        with engine.connect() as conn:
            assert "sweep_rungs" in inspect(conn).get_table_names()
            jobs = Table("jobs", MetaData(), autoload_with=conn)
            ends = conn.execute(select(jobs.c.metric_ends).order_by(jobs.c.id)).scalars().all()
        kl = {KL: [0, 2.0, 3, 1.0]}
        assert ends == [kl | {"custom/score": [1, 0.1, 2, 0.2]}, kl, kl]
    finally:
        engine.dispose()


def test_downgrade_drops_the_judgments(old_database):
    migrate(old_database)
    command.downgrade(alembic_config(old_database), "0007")
    engine = create_sync_engine(old_database)
    try:
        with engine.connect() as conn:
            assert "sweep_rungs" not in inspect(conn).get_table_names()
    finally:
        engine.dispose()
