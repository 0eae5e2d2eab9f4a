"""Submitting, reading, listing and steering jobs over HTTP (SQLite and Postgres)."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncSession

from app.auth.keys import NewKey
from app.jobs.schemas import JobStatus
from app.jobs.store import claim_job, stop_job
from tests.app.conftest import CLOSED_REDIS_URL, auth, serve, small_spec, upgraded_spec


async def test_submit_stores_and_queues_the_job(client, key, redis: Redis, queue_name):
    response = await client.post("/v1/jobs", json=small_spec(), headers=auth(key))
    assert response.status_code == 201
    job = response.json()
    assert job["status"] == "queued"
    assert job["team_id"] == key.team.id
    assert job["total_steps"] == 3
    assert job["spec"]["dataset"]["prompts"] == ["What is 1 + 1?"]
    assert job["spec"]["optim"]["learning_rate"] == 4e-5, "defaults are filled in"
    assert job["queue_reason"] and job["queue"]["position"] >= 1, "a queued job says why"
    assert await redis.zcard(queue_name) == 1

    read = await client.get(f"/v1/jobs/{job['id']}", headers=auth(key))
    assert read.status_code == 200
    assert read.json() == job


async def test_submit_accepts_the_x_api_key_header(client, key):
    response = await client.post("/v1/jobs", json=small_spec(), headers={"X-API-Key": key.key})
    assert response.status_code == 201


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (small_spec(loop={"steps": 0}), "loop.steps"),
        (small_spec(student={"lora_rank": 65}), "student.lora_rank"),
        (small_spec(unknown_group={}), "unknown_group"),
        (small_spec(loop={"steps": 3, "stepz": 4}), "loop.stepz"),
        (small_spec(backend="gpu"), "backend"),
    ],
)
async def test_a_bad_spec_is_a_422_naming_the_field(client, key, body, param):
    response = await client.post("/v1/jobs", json=body, headers=auth(key))
    assert response.status_code == 422
    error = response.json()["error"]
    assert error["code"] == "invalid_request"
    assert error["param"] == param
    assert param in error["message"]


async def test_a_body_that_is_not_json_is_a_422(client, key):
    response = await client.post(
        "/v1/jobs", content=b"{not json", headers=auth(key) | {"Content-Type": "application/json"}
    )
    assert response.status_code == 422
    assert "not valid JSON" in response.json()["error"]["message"]


async def test_redis_down_still_creates_the_job_with_a_reason(settings, key):
    async with serve(settings.model_copy(update={"redis_url": CLOSED_REDIS_URL})) as client:
        response = await client.post("/v1/jobs", json=small_spec(), headers=auth(key))
        assert response.status_code == 201
        job = response.json()
        assert job["status"] == "queued"
        assert "did not answer" in job["queue_reason"]
        listed = await client.get("/v1/jobs", headers=auth(key))
    assert [j["id"] for j in listed.json()["data"]] == [job["id"]]


async def test_idempotency_key_returns_the_first_job(client, key, redis: Redis, queue_name):
    headers = auth(key) | {"Idempotency-Key": "abc-1"}
    first = await client.post("/v1/jobs", json=small_spec(), headers=headers)
    # The same body written differently (its keys in another order) is the same request.
    reordered = dict(reversed(small_spec().items()))
    again = await client.post("/v1/jobs", json=reordered, headers=headers)
    assert first.status_code == 201
    assert again.status_code == 200
    assert again.json()["id"] == first.json()["id"]
    assert await redis.zcard(queue_name) == 1, "a repeat is not queued twice"

    different = await client.post("/v1/jobs", json=small_spec(loop={"steps": 4}), headers=headers)
    assert different.status_code == 422
    assert different.json()["error"]["code"] == "idempotency_key_reused"
    assert different.json()["error"]["param"] == "Idempotency-Key"


async def test_a_retry_after_an_upgrade_is_still_the_same_request(settings, key):
    headers = auth(key) | {"Idempotency-Key": "before-the-upgrade"}
    async with serve(settings) as client:
        first = await client.post("/v1/jobs", json=small_spec(), headers=headers)
    with upgraded_spec():
        async with serve(settings) as client:
            again = await client.post("/v1/jobs", json=small_spec(), headers=headers)
    assert first.status_code == 201, first.text
    assert again.status_code == 200, again.text
    assert again.json()["id"] == first.json()["id"]


async def test_idempotency_keys_are_per_team(client, key, make_key):
    other = await make_key()
    first = await client.post(
        "/v1/jobs", json=small_spec(), headers=auth(key) | {"Idempotency-Key": "k"}
    )
    second = await client.post(
        "/v1/jobs", json=small_spec(), headers=auth(other) | {"Idempotency-Key": "k"}
    )
    assert second.status_code == 201
    assert second.json()["id"] != first.json()["id"]


async def test_list_is_newest_first_with_cursor_pages(client, key, submit):
    ids = [(await submit())["id"] for _ in range(5)]
    page = await client.get("/v1/jobs", params={"limit": 2}, headers=auth(key))
    assert page.status_code == 200
    seen = [j["id"] for j in page.json()["data"]]
    cursor = page.json()["next_cursor"]
    while cursor is not None:
        page = await client.get("/v1/jobs", params={"limit": 2, "after": cursor}, headers=auth(key))
        seen += [j["id"] for j in page.json()["data"]]
        cursor = page.json()["next_cursor"]
    assert seen == ids[::-1]


async def test_list_filters_by_status(client, key, submit):
    kept = await submit()
    cancelled = await submit()
    await client.post(f"/v1/jobs/{cancelled['id']}/cancel", headers=auth(key))
    queued = await client.get("/v1/jobs", params={"status": "queued"}, headers=auth(key))
    assert [j["id"] for j in queued.json()["data"]] == [kept["id"]]
    done = await client.get("/v1/jobs", params={"status": "cancelled"}, headers=auth(key))
    assert [j["id"] for j in done.json()["data"]] == [cancelled["id"]]
    bad = await client.get("/v1/jobs", params={"status": "sleeping"}, headers=auth(key))
    assert bad.status_code == 422
    assert bad.json()["error"]["param"] == "status"


async def test_list_filters_by_name_metadata_and_sweep_as_the_dashboard_does(client, key, submit):
    arith = await submit(name="Arith-lr-1", metadata={"owner": "ana", "task": "arith"})
    await submit(name="tiny", metadata={"owner": "ana"})

    async def ids(**params: str) -> list[int]:
        response = await client.get("/v1/jobs", params=params, headers=auth(key))
        assert response.status_code == 200, response.text
        return [job["id"] for job in response.json()["data"]]

    assert await ids(name="arith") == [arith["id"]]  # any part, ignoring case
    assert await ids(metadata="owner=ana,task=arith") == [arith["id"]]
    assert len(await ids(metadata="owner=ana")) == 2
    assert await ids(metadata="owner=bob") == []
    assert await ids(sweep="1") == []  # neither is a sweep's trial
    bad = await client.get("/v1/jobs", params={"metadata": "owner"}, headers=auth(key))
    assert bad.status_code == 422 and bad.json()["error"]["param"] == "metadata"


async def test_list_limit_is_bounded(client, key):
    response = await client.get("/v1/jobs", params={"limit": 101}, headers=auth(key))
    assert response.status_code == 422
    assert response.json()["error"]["param"] == "limit"


async def test_another_teams_job_is_404_and_an_admin_sees_all(client, key, make_key, submit):
    other = await make_key()
    admin = await make_key(admin=True)
    mine = await submit()
    theirs = await submit(as_key=other)

    for path in ("", "/events", "/checkpoints", "/metrics"):
        response = await client.get(f"/v1/jobs/{theirs['id']}{path}", headers=auth(key))
        assert response.status_code == 404, path
        assert response.json()["error"]["code"] == "not_found"
    cancel = await client.post(f"/v1/jobs/{theirs['id']}/cancel", headers=auth(key))
    assert cancel.status_code == 404
    listed = await client.get("/v1/jobs", headers=auth(key))
    assert [j["id"] for j in listed.json()["data"]] == [mine["id"]]

    seen = {j["id"] for j in (await client.get("/v1/jobs", headers=auth(admin))).json()["data"]}
    assert {mine["id"], theirs["id"]} <= seen
    read = await client.get(f"/v1/jobs/{theirs['id']}", headers=auth(admin))
    assert read.status_code == 200


async def test_cancel_of_a_queued_job_is_immediate_and_idempotent(client, key, submit):
    job = await submit()
    first = await client.post(f"/v1/jobs/{job['id']}/cancel", headers=auth(key))
    assert first.status_code == 200
    assert first.json()["status"] == "cancelled"
    assert first.json()["finished_at"] is not None
    again = await client.post(f"/v1/jobs/{job['id']}/cancel", headers=auth(key))
    assert again.status_code == 200
    assert again.json()["status"] == "cancelled"
    resume = await client.post(f"/v1/jobs/{job['id']}/resume", headers=auth(key))
    assert resume.status_code == 409
    # Before: "the job is already cancelled; submit a new job to run it again".
    assert resume.json()["error"]["message"] == (
        f"the job is already cancelled; an ended job is not resumed. Clone it to run it again: "
        f"`opd clone {job['id']}` (POST /v1/jobs/{job['id']}/clone), and `opd clone "
        f"{job['id']} --init-from N` continues from the state it saved after step N"
    )


async def run_it(session: AsyncSession, job_id: int) -> None:
    assert await claim_job(session, job_id, "worker-1", heartbeat_timeout=60) is not None


async def test_running_job_cancel_waits_for_the_worker(client, key, submit, session):
    job = await submit()
    await run_it(session, job["id"])
    response = await client.post(f"/v1/jobs/{job['id']}/cancel", headers=auth(key))
    assert response.json()["status"] == "cancelling"
    pause = await client.post(f"/v1/jobs/{job['id']}/pause", headers=auth(key))
    assert pause.status_code == 409
    assert "being cancelled" in pause.json()["error"]["message"]
    await stop_job(session, job["id"], "worker-1", reason="stop requested")
    read = await client.get(f"/v1/jobs/{job['id']}", headers=auth(key))
    assert read.json()["status"] == "cancelled"


async def test_pause_then_resume_requeues_from_the_saved_state(
    client, key, submit, session, redis: Redis, queue_name
):
    job = await submit()
    await run_it(session, job["id"])
    pausing = await client.post(f"/v1/jobs/{job['id']}/pause", headers=auth(key))
    assert pausing.json()["status"] == "pausing"
    await stop_job(
        session,
        job["id"],
        "worker-1",
        reason="pause",
        state_path=f"/s/job-{job['id']}/x-state-000002",
        state_step=2,
    )
    paused = await client.post(f"/v1/jobs/{job['id']}/pause", headers=auth(key))
    assert paused.status_code == 200
    assert paused.json()["status"] == "paused"

    resumed = await client.post(f"/v1/jobs/{job['id']}/resume", headers=auth(key))
    assert resumed.status_code == 200
    body = resumed.json()
    assert body["status"] == "queued"
    assert body["last_state_path"] == f"job-{job['id']}/x-state-000002"  # a team's view
    assert await redis.zcard(queue_name) == 2, "submitted once, resumed once"
    again = await client.post(f"/v1/jobs/{job['id']}/resume", headers=auth(key))
    assert again.json()["status"] == "queued"
    assert await redis.zcard(queue_name) == 2, "resuming a queued job sends nothing"


async def test_resume_before_the_pause_took_effect_keeps_running(client, key, submit, session):
    job = await submit()
    await run_it(session, job["id"])
    await client.post(f"/v1/jobs/{job['id']}/pause", headers=auth(key))
    resumed = await client.post(f"/v1/jobs/{job['id']}/resume", headers=auth(key))
    assert resumed.json()["status"] == "running"


async def test_unknown_job_is_404(client, key):
    response = await client.post("/v1/jobs/999999/pause", headers=auth(key))
    assert response.status_code == 404
    assert response.json()["error"] == {
        "code": "not_found",
        "message": "job 999999 not found",
        "param": None,
    }


async def test_job_reads_share_a_short_lived_snapshot(settings, key: NewKey, submit, session):
    job = await submit()
    async with serve(settings.model_copy(update={"job_cache_seconds": 60})) as c:
        first = await c.get(f"/v1/jobs/{job['id']}", headers=auth(key))
        await run_it(session, job["id"])
        cached = await c.get(f"/v1/jobs/{job['id']}", headers=auth(key))
        assert cached.json() == first.json(), "a read within the ttl is served from memory"
        cancel = await c.post(f"/v1/jobs/{job['id']}/cancel", headers=auth(key))
        fresh = await c.get(f"/v1/jobs/{job['id']}", headers=auth(key))
    assert cancel.json()["status"] == fresh.json()["status"] == JobStatus.cancelling
