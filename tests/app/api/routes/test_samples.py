"""Kept rollouts and the job's summary over HTTP, scoped to the team like everything else."""

from __future__ import annotations

from app.jobs.store import claim_job
from app.records.store import record_eval, record_samples, record_step
from kernel.samples import KeptSample
from tests.app.conftest import auth


async def test_samples_page_by_step_and_stay_within_the_team(
    client, key, make_key, submit, session
):
    job = await submit()
    await claim_job(session, job["id"], "w1", heartbeat_timeout=60)
    for step in range(3):
        await record_samples(
            session,
            job["id"],
            "w1",
            step,
            [KeptSample(f"Q{step}", "ab", ["a", "b"], [0.5, -0.25]) for _ in range(2)],
        )
    url = f"/v1/jobs/{job['id']}/samples"

    page = (await client.get(url, params={"limit": 4}, headers=auth(key))).json()
    assert [(s["step"], s["position"]) for s in page["data"]] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert page["data"][0] | {"id": 0, "created_at": ""} == {
        "id": 0,
        "created_at": "",
        "step": 0,
        "position": 0,
        "prompt": "Q0",
        "completion": "ab",
        "tokens": ["a", "b"],
        "reverse_kl": [0.5, -0.25],
        "truncated": False,
    }
    rest = (await client.get(url, params={"after": page["next_cursor"]}, headers=auth(key))).json()
    assert [s["step"] for s in rest["data"]] == [2, 2] and rest["next_cursor"] is None
    only = (await client.get(url, params={"step": 1}, headers=auth(key))).json()
    assert {s["step"] for s in only["data"]} == {1}

    other = await make_key()
    assert (await client.get(url, headers=auth(other))).status_code == 404
    assert (await client.get(url, params={"step": -1}, headers=auth(key))).status_code == 422


async def test_the_job_body_summarises_kl_and_eval(client, key, submit, session):
    job = await submit()
    assert job["summary"] == {
        "reverse_kl": None,
        "eval_reverse_kl": None,
        "eval_accuracy": None,
        "teacher_accuracy": None,
    }
    await claim_job(session, job["id"], "w1", heartbeat_timeout=60)
    await record_step(
        session,
        job["id"],
        "w1",
        0,
        {"opd/reverse_kl_mean": 1.8, "eval/accuracy": 0.25, "eval/teacher_accuracy": 0.75},
    )
    await record_step(session, job["id"], "w1", 1, {"opd/reverse_kl_mean": 1.2})
    await record_eval(session, job["id"], "w1", 2, {"eval/accuracy": 0.5})

    body = (await client.get(f"/v1/jobs/{job['id']}", headers=auth(key))).json()
    assert body["summary"] == {
        "reverse_kl": {"first": 1.8, "last": 1.2},
        "eval_reverse_kl": None,
        "eval_accuracy": {"first": 0.25, "last": 0.5},
        "teacher_accuracy": 0.75,
    }
