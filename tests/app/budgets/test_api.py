"""The budget and estimate routes (SQLite and Postgres): an admin sets a team's budget by
name or id, the doors answer 429 `budget_exceeded` once it is spent (a replay of an
answered request still gets its job), bad input is a 4xx naming the field, and an estimate
is admitted like a job and stores nothing."""

from __future__ import annotations

import asyncio
import json

from sqlalchemy import func, select

from app.budgets.rules import BUDGET_STOP
from app.budgets.service import check_spending
from app.core.pricing import PriceTable
from app.core.tables import utcnow
from app.jobs.store import claim_job, stop_job
from app.jobs.tables import Job
from app.records.store import record_step
from tests.app.conftest import auth, small_spec
from tests.app.usage.test_store import usage


async def test_an_admin_sets_reads_and_removes_a_budget(client, key, make_key):
    admin = await make_key(admin=True)
    by_name = await client.put(
        f"/v1/teams/{key.team.name}/budget", json={"tokens": 1000}, headers=auth(admin)
    )
    assert by_name.status_code == 200, by_name.text
    body = by_name.json()
    assert (body["tokens"], body["soft"], body["period"], body["state"]) == (
        1000, 0.8, "month", "ok",
    )  # fmt: skip
    by_id = await client.get(f"/v1/teams/{key.team.id}/budget", headers=auth(admin))
    assert by_id.json()["team"] == key.team.name
    assert (
        await client.get(f"/v1/teams/{key.team.name}/budget", headers=auth(key))
    ).status_code == 403
    assert (
        await client.delete(f"/v1/teams/{key.team.name}/budget", headers=auth(admin))
    ).status_code == 204
    gone = await client.get(f"/v1/teams/{key.team.name}/budget", headers=auth(admin))
    assert gone.status_code == 404


async def test_bad_budgets_are_4xx_naming_the_field(client, key, make_key):
    admin = await make_key(admin=True)
    url = f"/v1/teams/{key.team.name}/budget"
    for body, param in (
        ({"tokens": 10, "cost": 1.0}, "body"),
        ({}, "body"),
        ({"tokens": 0}, "tokens"),
        ({"tokens": 10, "soft": 1.5}, "soft"),
        ({"cost": 2.0}, "cost"),  # no price table
    ):
        answer = await client.put(url, json=body, headers=auth(admin))
        assert answer.status_code == 422, (body, answer.text)
        assert answer.json()["error"]["param"] == param, (body, answer.json())
    missing = await client.put("/v1/teams/nobody/budget", json={"tokens": 5}, headers=auth(admin))
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"


async def test_a_spent_budget_is_a_429_and_a_replay_still_gets_its_job(
    client, key, make_key, sessions
):
    admin = await make_key(admin=True)
    await client.put(f"/v1/teams/{key.team.name}/budget", json={"tokens": 10}, headers=auth(admin))
    retried = {**auth(key), "Idempotency-Key": "once"}
    first = await client.post("/v1/jobs", json=small_spec(), headers=retried)
    assert first.status_code == 201
    async with sessions() as session:
        await claim_job(session, first.json()["id"], "w1", heartbeat_timeout=60)
        await record_step(session, first.json()["id"], "w1", 0, usage(5, 5, 5))

    refused = await client.post("/v1/jobs", json=small_spec(), headers=auth(key))
    replay = await client.post("/v1/jobs", json=small_spec(), headers=retried)
    clone = await client.post(f"/v1/jobs/{first.json()['id']}/clone", json={}, headers=auth(key))

    assert refused.status_code == 429
    error = refused.json()
    assert error["error"]["code"] == "budget_exceeded"
    assert "spent 15 tokens of its 10 tokens budget" in error["error"]["message"]
    assert (error["budget"]["spent"], error["budget"]["budget"]) == (15, 10)
    assert int(refused.headers["Retry-After"]) > 0
    assert replay.status_code == 200 and replay.json()["id"] == first.json()["id"]
    assert clone.status_code == 429
    other = await make_key()
    assert (
        await client.post("/v1/jobs", json=small_spec(), headers=auth(other))
    ).status_code == 201


async def test_a_job_its_spent_budget_paused_stays_paused_when_resumed(
    client, key, make_key, sessions
):
    """`opd resume` of such a job answered "queued" and it paused again at once, saying
    nothing: now a 429 that says why, the job left paused (it resumes by itself)."""
    admin = await make_key(admin=True)
    await client.put(f"/v1/teams/{key.team.name}/budget", json={"tokens": 10}, headers=auth(admin))
    job = (await client.post("/v1/jobs", json=small_spec(), headers=auth(key))).json()
    async with sessions() as session:
        await claim_job(session, job["id"], "w1", heartbeat_timeout=60)
        await record_step(session, job["id"], "w1", 0, usage(5, 5, 5))
        await check_spending(session, key.team.id, PriceTable([]), utcnow())  # -> pausing
        await stop_job(session, job["id"], "w1", reason=BUDGET_STOP)

    resumed = await client.post(f"/v1/jobs/{job['id']}/resume", headers=auth(key))
    after = (await client.get(f"/v1/jobs/{job['id']}", headers=auth(key))).json()
    await client.put(f"/v1/teams/{key.team.name}/budget", json={"tokens": 100}, headers=auth(admin))
    raised = await client.post(f"/v1/jobs/{job['id']}/resume", headers=auth(key))

    assert resumed.status_code == 429, resumed.text
    assert resumed.json()["error"]["code"] == "budget_exceeded"
    assert "spent 15 tokens of its 10 tokens budget" in resumed.json()["error"]["message"]
    assert (after["status"], after["stop_reason"]) == ("paused", "budget")
    assert raised.status_code == 200 and raised.json()["status"] in ("queued", "running")


async def test_a_sweeps_replay_still_gets_its_sweep_once_the_budget_is_spent(
    client, key, make_key, sessions
):
    admin = await make_key(admin=True)
    await client.put(f"/v1/teams/{key.team.name}/budget", json={"tokens": 10}, headers=auth(admin))
    definition = {
        "name": "lr",
        "base": small_spec(),
        "parameters": {"optim.learning_rate": {"values": [1e-3, 3e-3]}},
        "metric": {"name": "opd/reverse_kl_mean", "goal": "minimize"},
    }
    retried = {**auth(key), "Idempotency-Key": "sweep-once"}
    first = await client.post("/v1/sweeps", json=definition, headers=retried)
    assert first.status_code == 201, first.text
    job = (await client.post("/v1/jobs", json=small_spec(), headers=auth(key))).json()["id"]
    async with sessions() as session:
        await claim_job(session, job, "w1", heartbeat_timeout=60)
        await record_step(session, job, "w1", 0, usage(5, 5, 5))

    refused = await client.post("/v1/sweeps", json=definition, headers=auth(key))
    replay = await client.post("/v1/sweeps", json=definition, headers=retried)

    assert refused.status_code == 429 and refused.json()["error"]["code"] == "budget_exceeded"
    assert replay.status_code == 200 and replay.json()["id"] == first.json()["id"]


async def test_an_estimate_is_admitted_like_a_job_and_stores_nothing(client, key, sessions):
    spec = small_spec(loop={"steps": 10, "batch_size": 2, "group_size": 3})
    answer = await client.post("/v1/jobs/estimate", json=spec, headers=auth(key))
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["sampled_tokens"]["low"] == 10 * 2 * 3
    assert body["sampled_tokens"]["high"] == 10 * 2 * 3 * 512  # sampling.max_tokens
    for figure in ("sampled_tokens", "teacher_tokens", "trained_tokens", "eval_tokens"):
        span = body[figure]
        assert span["low"] <= span["point"] <= span["high"]
    assert body["cost"] is None and body["history"] == [] and body["budget"] is None
    assert any("no earlier job" in line for line in body["basis"])
    refused = await client.post(
        "/v1/jobs/estimate",
        json=small_spec(dataset={"source": "file", "path": "/etc/passwd"}),
        headers=auth(key),
    )
    assert refused.status_code == 422 and refused.json()["error"]["param"] == "dataset.path"
    async with sessions() as session:
        stored = select(func.count(Job.id)).where(Job.team_id == key.team.id)
        assert (await session.execute(stored)).scalar_one() == 0


async def test_an_estimate_counts_an_uploaded_files_questions_as_its_report_measured(client, key):
    """It assumed 128 tokens a prompt for any file (point 388,896 tokens where a job used
    236,212 on questions of 15 bytes): the upload measures its questions now."""
    rows = [{"question": f"What is {n} + 1?", "answer": str(n + 1)} for n in range(10, 30)]
    data = "".join(json.dumps(row) + "\n" for row in rows).encode()
    uploaded = await client.post(
        "/v1/files", params={"filename": "sums.jsonl"}, content=data, headers=auth(key)
    )
    assert uploaded.status_code == 201, uploaded.text
    assert uploaded.json()["report"]["question_bytes"] == {
        "shortest": 15, "mean": 15.0, "longest": 15,
    }  # fmt: skip
    dataset = {"source": "file", "file": uploaded.json()["id"], "question_suffix": ""}

    answer = await client.post(
        "/v1/jobs/estimate", json=small_spec(dataset=dataset), headers=auth(key)
    )

    assert answer.status_code == 200, answer.text
    basis = answer.json()["basis"]
    assert not any("assumed" in line for line in basis), basis
    assert any("the questions' 15 bytes" in line for line in basis), basis


async def test_concurrent_puts_on_a_team_without_a_budget_all_set_it(client, key, make_key):
    """Eight admins at once on a team with no budget: one row, every answer a 200 (an
    upsert; reading then inserting made the losers 500s on the unique key)."""
    admin = await make_key(admin=True)
    url = f"/v1/teams/{key.team.name}/budget"
    answers = await asyncio.gather(
        *(client.put(url, json={"tokens": 100 + n}, headers=auth(admin)) for n in range(8))
    )
    assert [answer.status_code for answer in answers] == [200] * 8, [a.text for a in answers]
    final = (await client.get(url, headers=auth(admin))).json()["tokens"]
    assert final in {100 + n for n in range(8)}


async def test_only_ascii_digits_name_a_team_by_its_id(client, key, make_key):
    """'²' passes `isdigit` but not `int` (it was a 500); '١' is Arabic-Indic one, which
    `int` reads as 1: neither names a team by its id, so both are the 404 of a missing team."""
    admin = await make_key(admin=True)
    for ref in ("%C2%B2", "%D9%A1", "%EF%BC%91"):
        answer = await client.get(f"/v1/teams/{ref}/budget", headers=auth(admin))
        assert answer.status_code == 404, (ref, answer.text)
        assert answer.json()["error"]["message"].startswith("no team named"), answer.json()
