"""Migration 0004 on a database filled at revision 0003: every existing key keeps what it
could do (admin keys the `admin` scope, the others `submit`), jobs wait since they were
created and have no usage yet, and the new tables work; the downgrade gives it all back."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from alembic import command
from sqlalchemy import MetaData, Table, inspect, select

from app.auth.keys import authenticate, hash_key
from app.auth.schemas import Scope
from app.core.db import (
    alembic_config,
    create_db_engine,
    create_sync_engine,
    migrate,
    session_factory,
)
from app.jobs.rows import get_job
from tests.app.conftest import small_spec
from tests.support import temporary_postgres_database

NOW = datetime(2026, 11, 1, tzinfo=UTC)
KEYS = {"opd_admin01_secret": ("admin01", True), "opd_plain01_secret": ("plain01", False)}


@pytest.fixture(params=["sqlite", "postgres"])
def old_database(request, tmp_path) -> Iterator[tuple[str, int]]:
    """A database at revision 0003 with an admin key, a plain key and a job; the job's id."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'old.db'}"
        yield url, fill(url)
        return
    with temporary_postgres_database() as url:
        yield url, fill(url)


def fill(url: str) -> int:
    migrate(url, "0003")
    engine = create_sync_engine(url)
    try:
        with engine.begin() as conn:
            tables = MetaData()
            teams, keys, jobs = (
                Table(name, tables, autoload_with=conn) for name in ("teams", "api_keys", "jobs")
            )
            team_id = conn.execute(
                teams.insert().values(name="old", created_at=NOW).returning(teams.c.id)
            ).scalar_one()
            for key, (prefix, admin) in KEYS.items():
                conn.execute(
                    keys.insert().values(
                        team_id=team_id,
                        prefix=prefix,
                        key_hash=hash_key(key),
                        is_admin=admin,
                        created_at=NOW,
                    )
                )
            job = {
                "team_id": team_id, "name": "old", "status": "queued", "spec": small_spec(),
                "created_at": NOW, "updated_at": NOW, "steps_done": 0, "total_steps": 3,
                "attempts": 0, "enqueue_count": 1, "metric_ends": {},
            }  # fmt: skip
            return conn.execute(jobs.insert().values(job).returning(jobs.c.id)).scalar_one()
    finally:
        engine.dispose()


async def test_upgrade_keeps_each_keys_effective_scope_and_dates_the_jobs_wait(old_database):
    url, job_id = old_database
    migrate(url)
    engine = create_db_engine(url)
    try:
        async with session_factory(engine)() as session:
            admin = await authenticate(session, "opd_admin01_secret")
            plain = await authenticate(session, "opd_plain01_secret")
            job = await get_job(session, job_id)
    finally:
        await engine.dispose()
    assert (admin.key_scope, admin.is_admin, admin.expires_at) == (Scope.admin, True, None)
    assert (plain.key_scope, plain.is_admin) == (Scope.submit, False)
    assert job.queued_at == NOW and job.priority == 0
    assert job.usage.model_dump(exclude={"estimated_cost"}) == {
        "sampled_tokens": 0,
        "teacher_tokens": 0,
        "trained_tokens": 0,
        "eval_tokens": 0,
    }


def test_downgrade_gives_the_admin_flag_back(old_database):
    url, _ = old_database
    migrate(url)
    command.downgrade(alembic_config(url), "0003")
    engine = create_sync_engine(url)
    try:
        with engine.connect() as conn:
            inspector = inspect(conn)
            assert not {"usage_days", "audit_log", "webhooks"} & set(inspector.get_table_names())
            keys = Table("api_keys", MetaData(), autoload_with=conn)
            flags = dict(conn.execute(select(keys.c.prefix, keys.c.is_admin)).all())
    finally:
        engine.dispose()
    assert flags == {"admin01": True, "plain01": False}
