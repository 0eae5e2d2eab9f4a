"""Curves of several jobs in one call, scoped to the caller's team."""

from __future__ import annotations

from app.jobs.store import claim_job, complete_job
from app.records.store import record_step
from tests.app.conftest import auth

WORKER = "worker-1"


async def record(session, job_id: int, kls: list[float]) -> None:
    await claim_job(session, job_id, WORKER, heartbeat_timeout=60)
    for step, kl in enumerate(kls):
        await record_step(session, job_id, WORKER, step, {"opd/reverse_kl_mean": kl, "x": 1.0})


async def test_curves_of_each_job_in_the_order_asked(client, key, submit, session):
    first, second = await submit(), await submit()
    await record(session, first["id"], [3.0, 2.0])
    await record(session, second["id"], [5.0, 4.0, 3.0])
    response = await client.get(
        "/v1/metrics",
        params={"jobs": f"{second['id']},{first['id']}", "keys": "opd/reverse_kl_mean"},
        headers=auth(key),
    )
    assert response.status_code == 200
    jobs = response.json()["jobs"]
    assert [job["job_id"] for job in jobs] == [second["id"], first["id"]]
    curve = {"steps": [0, 1, 2], "values": [5.0, 4.0, 3.0]}
    assert jobs[0]["curves"] == {"opd/reverse_kl_mean": curve}
    assert jobs[1]["curves"]["opd/reverse_kl_mean"]["values"] == [3.0, 2.0]
    assert jobs[1]["downsampling"]["method"] == "none"


async def test_another_teams_job_is_a_404(client, key, make_key, submit):
    mine = await submit()
    theirs = await submit(as_key=await make_key())
    response = await client.get(
        "/v1/metrics", params={"jobs": f"{mine['id']},{theirs['id']}"}, headers=auth(key)
    )
    assert response.status_code == 404
    assert response.json()["error"]["message"] == f"job {theirs['id']} not found"


async def test_etag_covers_every_job(client, key, submit, session):
    first, second = await submit(), await submit()
    await record(session, first["id"], [1.0])
    await record(session, second["id"], [1.0])
    params = {"jobs": f"{first['id']},{second['id']}"}
    tag = (await client.get("/v1/metrics", params=params, headers=auth(key))).headers["etag"]
    unchanged = await client.get(
        "/v1/metrics", params=params, headers=auth(key) | {"If-None-Match": tag}
    )
    assert unchanged.status_code == 304
    await complete_job(session, second["id"], WORKER, "/weights")
    changed = await client.get(
        "/v1/metrics", params=params, headers=auth(key) | {"If-None-Match": tag}
    )
    assert changed.status_code == 200
    assert changed.headers["cache-control"] == "private, no-cache", "one job still runs"


async def test_bad_job_lists_are_422(client, key, submit):
    job = await submit()
    cases = ["", "1,x", ",".join(str(i) for i in range(1, 30)), "0", str(2**31), f"{job['id']},-1"]
    for jobs in cases:
        response = await client.get("/v1/metrics", params={"jobs": jobs}, headers=auth(key))
        assert response.status_code == 422, jobs
        assert response.json()["error"]["param"] == "jobs"
    missing = await client.get("/v1/metrics", headers=auth(key))
    assert missing.status_code == 422 and missing.json()["error"]["param"] == "jobs"


async def test_one_job_route_and_the_many_jobs_route_never_share_an_answer(
    client, key, submit, session
):
    job = await submit()
    await record(session, job["id"], [2.0, 1.0])
    query = {"keys": "opd/reverse_kl_mean"}
    many = await client.get("/v1/metrics", params=query | {"jobs": job["id"]}, headers=auth(key))
    one = await client.get(f"/v1/jobs/{job['id']}/metrics", params=query, headers=auth(key))
    assert many.status_code == one.status_code == 200
    assert many.headers["etag"] != one.headers["etag"]
    assert [entry["job_id"] for entry in many.json()["jobs"]] == [job["id"]]
    assert one.json()["curves"]["opd/reverse_kl_mean"]["values"] == [2.0, 1.0]
    crossed = await client.get(
        f"/v1/jobs/{job['id']}/metrics",
        params=query,
        headers=auth(key) | {"If-None-Match": many.headers["etag"]},
    )
    assert crossed.status_code == 200, "the other route's ETag does not match here"
