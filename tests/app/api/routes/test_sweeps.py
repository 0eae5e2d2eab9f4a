"""/v1/sweeps: a definition checked before anything is stored (the parameter that makes an
invalid spec named), teams kept apart, a cancel that ends the sweep, cancels its trials and
says so by webhook; the trials the controller starts show in the job list."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from app.auth.schemas import Scope
from app.jobs.limits import Limits
from app.jobs.rows import get_job
from app.jobs.store import claim_job, complete_job
from app.records.store import record_checkpoint
from app.sweeps import admission
from app.sweeps.control import advance, claim_sweeps
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


async def test_a_sweep_over_objectives_shows_each_trials_objective_by_name(client, key, sessions):
    objectives = {"loop.objective": {"values": ["sampled_reverse_kl", "jsd"]}}
    sweep = (await create(client, key, parameters=objectives)).json()
    await start_trials(sessions, sweep["id"])

    read = await client.get(f"/v1/sweeps/{sweep['id']}", headers=auth(key))

    assert read.status_code == 200, read.text
    assert [t["values"] for t in read.json()["trials"]] == [
        {"loop.objective": "sampled_reverse_kl"},
        {"loop.objective": "jsd"},
    ]


async def test_an_idempotency_key_makes_one_sweep_of_a_retried_request(client, key, make_key):
    """A retry after a lost answer (the same key and body, however it is written) is the
    sweep first made (200); the key with another body is a 422; keys are per team."""
    headers = auth(key) | {"Idempotency-Key": "sweep-1"}
    first = await client.post("/v1/sweeps", json=definition(), headers=headers)
    reordered = dict(reversed(definition().items()))
    again = await client.post("/v1/sweeps", json=reordered, headers=headers)
    assert (first.status_code, again.status_code) == (201, 200), again.text
    assert again.json()["id"] == first.json()["id"]
    listed = (await client.get("/v1/sweeps", headers=auth(key))).json()["data"]
    assert [sweep["id"] for sweep in listed] == [first.json()["id"]]

    different = await client.post("/v1/sweeps", json=definition(name="other"), headers=headers)
    assert different.status_code == 422, different.text
    error = different.json()["error"]
    assert (error["code"], error["param"]) == ("idempotency_key_reused", "Idempotency-Key")

    other = await make_key()
    theirs = await client.post(
        "/v1/sweeps", json=definition(), headers=auth(other) | {"Idempotency-Key": "sweep-1"}
    )
    assert theirs.status_code == 201 and theirs.json()["id"] != first.json()["id"]


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


async def test_a_job_spec_sent_as_a_sweep_says_what_a_sweep_needs(client, key):
    """Before: one `Extra inputs are not permitted` for each group of the spec."""
    response = await client.post("/v1/sweeps", json=small_spec(), headers=auth(key))
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["param"] == "base"
    assert error["message"].startswith(
        "base: this is a job spec, not a sweep: a sweep needs `base:` (the job spec, indented "
        "under it, or `base_job:` and a job id) and `parameters:`"
    )
    assert "unknown field" not in error["message"] and error["message"].count("base:") == 2


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


@pytest.fixture
def trained(session, submit):
    """A succeeded trio job of `as_key`'s team that saved final weights under `root`."""

    async def make(root: str, as_key=None) -> dict[str, Any]:
        job = await submit(as_key, backend="trio")
        await claim_job(session, job["id"], "w", heartbeat_timeout=60)
        await record_checkpoint(session, job["id"], "w", 3, "final", f"{root}/final")
        await complete_job(session, job["id"], "w", f"{root}/final")
        return job

    return make


def distilling(parameters: dict[str, Any]) -> dict[str, Any]:
    """A trio sweep whose teacher may be weights the team trained."""
    base = small_spec(backend="trio", teacher={"base_model": "Qwen/Qwen3.5-4B"})
    return {"base": base, "parameters": parameters, "max_trials": 2}


async def test_a_sweep_names_saved_weights_only_by_init_from_job_and_checkpoint(
    client, key, make_key, trained, sessions
):
    """A sweep over `*.init_from.path` (with another team's weights, or anything) is a 422
    naming the parameter, as is one over another team's job; a sweep over the team's own
    jobs is stored, and each trial's path is filled in from its job."""
    theirs = await trained("trio://fake/theirs", await make_key())
    ours = await trained("trio://fake/ours")
    saved = ["trio://fake/theirs/final"]
    refused = {
        "teacher.init_from.path": {"values": saved},
        "student.init_from.path": {"values": saved},
        "student.init_from.with_optimizer": {"values": [True, False]},
        "teacher.init_from": {"values": saved},
        "teachers.mul.init_from.path": {"values": saved},
    }
    for path, parameter in refused.items():
        response = await create(client, key, **distilling({path: parameter}))
        assert response.status_code == 422, response.text
        error = response.json()["error"]
        assert error["param"] == f"parameters.{path}", error
        assert "only init_from.job and init_from.checkpoint may be swept" in error["message"]

    jobs = {"teacher.init_from.job": {"values": [ours["id"], theirs["id"]]}}
    other = (await create(client, key, **distilling(jobs))).json()["error"]
    assert other["param"] == "parameters.teacher.init_from.job"
    assert f"job {theirs['id']} is not one of your team's jobs" in other["message"]

    jobs = {"teacher.init_from.job": {"values": [ours["id"]]}}
    response = await create(client, key, **distilling(jobs))
    assert response.status_code == 201, response.text
    (trial,) = await start_trials(sessions, response.json()["id"])
    async with sessions() as session:
        init_from = (await get_job(session, trial)).spec["teacher"]["init_from"]
    assert init_from == {"job": ours["id"], "checkpoint": "final", "path": "trio://fake/ours/final"}
    listed = (await client.get("/v1/jobs", headers=auth(key))).json()["data"]
    assert all("theirs" not in str(job["spec"]) for job in listed)


def many_values(count: int) -> dict[str, Any]:
    """Parameters giving `count` values in all (random search: no grid to bound)."""
    rates = [round(1e-4 * (n + 1), 6) for n in range(count)]
    chunks = [rates[at : at + 100] for at in range(0, count, 100)]
    paths = ["optim.learning_rate", "optim.beta1", "optim.beta2", "optim.eps"]
    return {
        "parameters": {path: {"values": chunk} for path, chunk in zip(paths, chunks, strict=False)},
        "method": "random",
    }


async def test_a_sweep_gives_at_most_sweep_max_values_values(client, key, settings):
    limit = settings.sweep_max_values
    over = await create(client, key, **many_values(limit + 1))
    assert over.status_code == 422, over.text
    error = over.json()["error"]
    assert error["param"] == "parameters"
    assert f"{limit + 1} values in all" in error["message"]
    ranged = many_values(limit - 1)
    ranged["parameters"]["optim.weight_decay"] = {"min": 0.0, "max": 0.1}
    assert (await create(client, key, **ranged)).status_code == 422, "a range counts two"
    assert (await create(client, key, **many_values(limit))).status_code == 201


async def test_a_sweeps_probes_are_parsed_off_the_event_loop(client, key, monkeypatch):
    """Parsing each probe's spec is CPU work: it runs in a thread, so other requests on
    the API's event loop go on meanwhile."""
    parsed_in = []
    probe_specs = admission.probe_specs

    def spying(*args: Any) -> Any:
        parsed_in.append(threading.current_thread())
        return probe_specs(*args)

    monkeypatch.setattr(admission, "probe_specs", spying)
    assert (await create(client, key)).status_code == 201
    assert parsed_in and threading.main_thread() not in parsed_in
