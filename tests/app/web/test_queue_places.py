"""The API, its job lists and the dashboard say why a queued job waits (a fresh database of
each kind: a queued job's place counts every queued job there is). Before, `queue_reason`
was null behind another team's running job."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from app.core.tables import utcnow
from app.jobs.store import claim_job
from app.jobs.workers import note_worker
from tests.app.conftest import auth
from tests.support import migrated_database


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request: pytest.FixtureRequest, tmp_path) -> Iterator[str]:
    with migrated_database(request.param, tmp_path) as url:
        yield url


async def test_the_api_and_the_dashboard_say_why_a_queued_job_waits(
    client, key, make_key, submit, sessions, sign_in
):
    first = await submit()
    other = await make_key()
    waiting = await submit(as_key=other)
    async with sessions() as session:
        await claim_job(session, first["id"], "w1", heartbeat_timeout=60)
        await note_worker(session, "w1", 1, utcnow())

    job = (await client.get(f"/v1/jobs/{waiting['id']}", headers=auth(other))).json()
    listed = (await client.get("/v1/jobs", headers=auth(other))).json()["data"]
    await sign_in(other)
    page = (await client.get(f"/ui/jobs/{waiting['id']}")).text
    table = (await client.get("/ui/jobs")).text

    assert job["queue_reason"].startswith("Waiting for a worker slot: the workers have 1")
    assert job["queue"] == {
        "position": 1,
        "ahead": 0,
        "ahead_in_team": 0,
        "running": 1,
        "running_in_team": 0,
        "slots": 1,
        "held_by_team_limit": False,
    }
    assert listed[0]["queue_reason"] == job["queue_reason"]
    assert "Waiting for a worker slot" in page and 'id="job-waiting"' in page
    assert 'class="muted queue-place"' in table and "#1</span>" in table
