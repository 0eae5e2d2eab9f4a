"""/v1/sweeps: a definition checked before anything is stored (the parameter that makes an
invalid spec named), teams kept apart, a cancel that ends the sweep, cancels its trials and
says so by webhook; the trials the controller starts show in the job list."""

from __future__ import annotations

from typing import Any

from app.models import Scope
from app.store.limits import Limits
from app.store.sweep_control import advance, claim_sweeps
from tests.app.conftest import auth, small_spec


def definition(**fields: Any) -> dict[str, Any]:
    return {
        "name": "lr",
        "base": small_spec(),
        "parameters": {"optim.learning_rate": {"values": [1e-3, 3e-3]}},
        "method": "grid",
        "metric": {"name": "opd/reverse_kl_mean", "goal": "minimize"},
        "max_trials": 4,
        "parallel": 2,
    } | fields


async def create(client, key, **fields: Any):
    return await client.post("/v1/sweeps", json=definition(**fields), headers=auth(key))


async def start_trials(sessions, sweep_id: int) -> list[int]:
    """One pass of the controller, as a worker runs it."""
    async with sessions() as session:
        assert sweep_id in await claim_sweeps(session, "test-controller", 60)
        return (await advance(session, sweep_id, "test-controller", Limits())).created


async def test_a_sweep_is_stored_and_its_trials_are_jobs_of_the_team(client, key, sessions):
    response = await create(client, key)
    assert response.status_code == 201, response.text
    sweep = response.json()
    assert (sweep["status"], sweep["trials_planned"], sweep["trials"]) == ("running", 2, [])
    assert sweep["base"]["loop"]["steps"] == 3  # the validated spec, defaults filled in

    created = await start_trials(sessions, sweep["id"])
    assert len(created) == 2
    jobs = (await client.get("/v1/jobs", headers=auth(key))).json()["data"]
    assert sorted(
        (j["sweep_id"], j["sweep_trial"], j["spec"]["optim"]["learning_rate"]) for j in jobs
    ) == [
        (sweep["id"], 1, 1e-3),
        (sweep["id"], 2, 3e-3),
    ]
    read = (await client.get(f"/v1/sweeps/{sweep['id']}", headers=auth(key))).json()
    assert [(t["number"], t["values"], t["status"]) for t in read["trials"]] == [
        (1, {"optim.learning_rate": 1e-3}, "queued"),
        (2, {"optim.learning_rate": 3e-3}, "queued"),
    ]
    listed = (await client.get("/v1/sweeps", headers=auth(key))).json()
    assert [(s["id"], s["trials_created"]) for s in listed["data"]] == [(sweep["id"], 2)]


async def test_a_bad_definition_is_a_422_naming_what_to_change(client, key):
    cases = [
        ({"parameters": {"student.lora_rank": {"values": [8, 2]}}}, "parameters.student.lora_rank"),
        ({"parameters": {"optim.lr": {"values": [0.1]}}}, "parameters.optim.lr"),
        (
            {"parameters": {"optim.learning_rate": {"min": 1e-3, "max": 2.0}}, "method": "random"},
            "parameters.optim.learning_rate",
        ),
        ({"max_trials": 1}, "max_trials"),
        ({"base": small_spec(loop={"steps": 0})}, "base.loop.steps"),
        ({"base_job": 1}, None),
        ({"parameters": {"optim.learning_rate": {"min": 1e-3, "max": 1e-2}}}, None),
    ]
    for fields, param in cases:
        response = await create(client, key, **fields)
        assert response.status_code == 422, (fields, response.text)
        assert response.json()["error"]["param"] == param or param is None, response.text
    grid = await create(client, key, max_trials=1)
    assert "the grid has 2 points" in grid.json()["error"]["message"]
    assert (await client.get("/v1/sweeps", headers=auth(key))).json()["data"] == []


async def test_another_teams_sweep_and_job_are_not_found(client, key, make_key, submit):
    other = await make_key()
    sweep = (await create(client, key)).json()
    job = await submit()
    for method, path in (
        ("GET", f"/v1/sweeps/{sweep['id']}"),
        ("POST", f"/v1/sweeps/{sweep['id']}/cancel"),
    ):
        response = await client.request(method, path, headers=auth(other))
        assert response.status_code == 404, response.text
        assert response.json()["error"]["message"] == f"sweep {sweep['id']} not found"
    assert (await client.get("/v1/sweeps", headers=auth(other))).json()["data"] == []
    from_job = await create(client, other, base=None, base_job=job["id"])
    assert from_job.status_code == 404
    assert (await client.get(f"/v1/sweeps/{sweep['id']}", headers=auth(key))).status_code == 200


async def test_a_sweep_can_start_from_a_job(client, key, submit):
    job = await submit(loop={"steps": 5})
    sweep = (await create(client, key, base=None, base_job=job["id"])).json()
    assert sweep["base_job"] == job["id"]
    assert sweep["base"] == job["spec"]


async def test_a_read_key_may_look_but_not_create_or_cancel(client, key, make_key):
    reader = await make_key(key.team.name, scope=Scope.read)
    sweep = (await create(client, key)).json()
    assert (await create(client, reader)).status_code == 403
    assert (
        await client.post(f"/v1/sweeps/{sweep['id']}/cancel", headers=auth(reader))
    ).status_code == 403
    assert (await client.get(f"/v1/sweeps/{sweep['id']}", headers=auth(reader))).status_code == 200


async def test_cancel_ends_the_sweep_cancels_its_trials_and_sends_sweep_completed(
    client, key, sessions
):
    hook = await client.post(
        "/v1/webhooks",
        json={"url": "https://hooks.example.com/opd", "events": ["sweep.completed"]},
        headers=auth(key),
    )
    sweep = (await create(client, key)).json()
    await start_trials(sessions, sweep["id"])

    cancelled = await client.post(f"/v1/sweeps/{sweep['id']}/cancel", headers=auth(key))
    again = await client.post(f"/v1/sweeps/{sweep['id']}/cancel", headers=auth(key))

    assert cancelled.json()["status"] == again.json()["status"] == "cancelled"
    assert [t["status"] for t in cancelled.json()["trials"]] == ["cancelled", "cancelled"]
    deliveries = (
        await client.get(f"/v1/webhooks/{hook.json()['id']}/deliveries", headers=auth(key))
    ).json()["data"]
    assert [
        (d["event"], d["payload"]["data"]["sweep_id"], d["payload"]["data"]["status"])
        for d in deliveries
    ] == [("sweep.completed", sweep["id"], "cancelled")]
    async with sessions() as session:
        assert sweep["id"] not in await claim_sweeps(session, "test-controller", 60)  # ended
