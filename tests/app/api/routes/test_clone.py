"""Continue and clone: `student.init_from` checked against the job it names (each refusal a
422 naming its field), its state path filled by the service; `POST /v1/jobs/{id}/clone`
with a JSON merge patch of the spec."""

from __future__ import annotations

from typing import Any

import pytest

from app.jobs.store import claim_job, complete_job
from app.records.store import record_checkpoint
from tests.app.conftest import auth, small_spec, upgraded_spec

STATES = [
    (2, "state", "/a/job-7/state-2"),
    (2, "sampler", "/a/job-7/sampler-2"),
    (4, "state", "/a/job-7/state-4"),
]


@pytest.fixture
def trained(session, submit):
    """A job of the caller's team that saved `STATES` (and, finished, its final weights)."""

    async def make(finish: bool = True, **spec: Any) -> dict[str, Any]:
        job = await submit(loop={"steps": 4}, **spec)
        await claim_job(session, job["id"], "w", heartbeat_timeout=60)
        for step, kind, path in STATES:
            await record_checkpoint(session, job["id"], "w", step, kind, path)
        if finish:
            await record_checkpoint(session, job["id"], "w", 4, "final", "/a/job-7/final")
            await complete_job(session, job["id"], "w", "/a/job-7/final")
        return job

    return make


def continuing(job_id: int, **init: Any) -> dict[str, Any]:
    return small_spec(student={"init_from": {"job": job_id, **init}})


@pytest.mark.parametrize(
    ("init", "path"),
    [
        ({}, "job-7/state-4"),  # a team sees the filled path from the job's folder on
        ({"checkpoint": "final", "with_optimizer": True}, "job-7/state-4"),
        ({"checkpoint": 2}, "job-7/state-2"),
    ],
)
async def test_a_continued_job_gets_the_path_of_the_state_it_names(
    client, key, trained, init, path
):
    source = await trained()
    response = await client.post(
        "/v1/jobs", json=continuing(source["id"], **init), headers=auth(key)
    )

    assert response.status_code == 201, response.text
    init_from = response.json()["spec"]["student"]["init_from"]
    assert init_from == {
        "job": source["id"],
        "checkpoint": "final",
        "with_optimizer": False,
    } | init | {"path": path}


async def refusal(client, key, spec: dict[str, Any]) -> dict[str, Any]:
    response = await client.post("/v1/jobs", json=spec, headers=auth(key))
    assert response.status_code == 422, response.text
    return response.json()["error"]


@pytest.mark.parametrize(
    ("change", "param", "words"),
    [
        ({"init": {"path": "/etc/passwd"}}, "student.init_from.path", "filled by the service"),
        (
            {"init": {"checkpoint": 3}},
            "student.init_from.checkpoint",
            "no training state after step 3",
        ),
        ({"init": {"checkpoint": 2}, "unfinished": True}, None, None),
        ({"unfinished": True}, "student.init_from.checkpoint", "has not succeeded"),
        ({"spec": {"backend": "trio"}}, "backend", "'local'"),
        ({"spec": {"student": {"base_model": "tiny-teacher"}}}, "student.base_model", "'Qwen"),
        ({"spec": {"student": {"lora_rank": 8}}}, "student.lora_rank", "32"),
    ],
)
async def test_init_from_is_refused_naming_the_field(client, key, trained, change, param, words):
    source = await trained(finish=not change.get("unfinished"))
    spec = continuing(source["id"], **change.get("init", {}))
    for group, values in change.get("spec", {}).items():
        spec[group] = spec.get(group, {}) | values if isinstance(values, dict) else values
    if param is None:  # a step's state exists before the job ends
        response = await client.post("/v1/jobs", json=spec, headers=auth(key))
        assert response.status_code == 201, response.text
        return
    error = await refusal(client, key, spec)
    assert error["param"] == param and words in error["message"], error


async def test_init_from_names_only_the_callers_teams_jobs(client, key, make_key, trained):
    """An admin key too: the job it submits is its own team's, and the worker loads only
    weights the database records for a job of the job's team."""
    theirs = await trained()
    missing = await refusal(client, await make_key(), continuing(theirs["id"]))
    assert missing["param"] == "student.init_from.job"
    assert f"job {theirs['id']} is not one of your team's jobs" in missing["message"]
    nowhere = await refusal(client, key, continuing(999_999))
    assert nowhere["param"] == "student.init_from.job"
    elsewhere = await refusal(client, await make_key(admin=True), continuing(theirs["id"]))
    assert elsewhere == missing
    admin = await make_key(key.team.name, admin=True)
    response = await client.post("/v1/jobs", json=continuing(theirs["id"]), headers=auth(admin))
    assert response.status_code == 201, response.text


async def test_a_clone_applies_a_merge_patch_to_the_jobs_spec(client, key, submit):
    job = await submit(optim={"learning_rate": 0.001, "beta1": 0.8}, metadata={"run": "a"})
    patch = {"optim": {"learning_rate": 2e-5}, "metadata": None, "name": "tuned"}

    response = await client.post(f"/v1/jobs/{job['id']}/clone", json=patch, headers=auth(key))

    assert response.status_code == 201, response.text
    clone = response.json()
    assert clone["id"] != job["id"] and clone["status"] == "queued" and clone["name"] == "tuned"
    assert clone["spec"]["optim"] == job["spec"]["optim"] | {"learning_rate": 2e-5}
    assert clone["spec"]["metadata"] == {}  # null: back to the default
    assert {k: v for k, v in clone["spec"].items() if k not in patch} == {
        k: v for k, v in job["spec"].items() if k not in patch
    }


async def test_a_clone_with_a_bad_patch_or_of_another_teams_job_is_refused(
    client, key, make_key, submit
):
    job = await submit()
    url = f"/v1/jobs/{job['id']}/clone"
    bad = await client.post(url, json={"loop": {"steps": 0}}, headers=auth(key))
    assert bad.status_code == 422
    assert bad.json()["error"]["param"] == "loop.steps"
    unknown = await client.post(url, json={"optim": {"lr": 1}}, headers=auth(key))
    assert unknown.status_code == 422 and unknown.json()["error"]["param"] == "optim.lr"
    not_an_object = await client.post(url, json=[1], headers=auth(key))
    assert not_an_object.status_code == 422
    other = await client.post(url, json={}, headers=auth(await make_key()))
    assert other.status_code == 404


async def test_a_clone_continues_the_job_and_refills_the_state_path(client, key, trained):
    source = await trained()
    continued = await client.post(
        f"/v1/jobs/{source['id']}/clone",
        json={"student": {"init_from": {"job": source["id"], "checkpoint": 2}}},
        headers=auth(key),
    )
    assert continued.status_code == 201, continued.text
    first = continued.json()
    assert first["spec"]["student"]["init_from"]["path"] == "job-7/state-2"

    again = await client.post(
        f"/v1/jobs/{first['id']}/clone",
        json={"student": {"init_from": {"checkpoint": "final"}}},
        headers=auth(key),
    )
    assert again.status_code == 201, again.text
    assert again.json()["spec"]["student"]["init_from"]["path"] == "job-7/state-4"


async def test_the_same_idempotency_key_clones_once(client, key, submit):
    job = await submit()
    headers = auth(key) | {"Idempotency-Key": "clone-1"}
    url = f"/v1/jobs/{job['id']}/clone"
    first = await client.post(url, json={"name": "again"}, headers=headers)
    second = await client.post(url, json={"name": "again"}, headers=headers)
    assert (first.status_code, second.status_code) == (201, 200)
    assert first.json()["id"] == second.json()["id"]


async def test_a_clone_retried_after_an_upgrade_is_the_same_request(client, key, submit):
    job = await submit()
    headers = auth(key) | {"Idempotency-Key": "clone-across-an-upgrade"}
    url = f"/v1/jobs/{job['id']}/clone"
    first = await client.post(url, json={"name": "again"}, headers=headers)
    with upgraded_spec():
        second = await client.post(url, json={"name": "again"}, headers=headers)
    assert (first.status_code, second.status_code) == (201, 200), second.text
    assert first.json()["id"] == second.json()["id"]
