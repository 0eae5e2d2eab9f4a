"""The playground's API side with no worker running: bad requests are 422s naming the
field, another team's job is a 404, and a request no worker takes is a 504 and is
withdrawn from the queue. (With workers: tests/worker/service/test_quick.py, and real
processes in tests/e2e/test_playground.py.)"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from app.core.worker_calls import quick_queue
from app.jobs.store import claim_job, create_job
from app.records.store import record_checkpoint
from kernel.spec import JobSpec
from tests.app.conftest import CLOSED_REDIS_URL, auth, serve, small_spec


@pytest.fixture
def sampled(session, submit):
    """A running job of the caller's team that saved sampler weights after step 2."""

    async def make() -> dict[str, Any]:
        job = await submit(loop={"steps": 4})
        await claim_job(session, job["id"], "w", heartbeat_timeout=60)
        await record_checkpoint(session, job["id"], "w", 2, "sampler", "/w/2")
        return job

    return make


async def all_waiting(
    redis, queue_name: str, requests: list[asyncio.Task], tasks: int | None = None
) -> None:
    """Until every request has sent its task (`tasks` in all, default one each) to the
    (absent) workers, or one has ended."""
    while await redis.zcard(quick_queue(queue_name)) < (tasks or len(requests)):
        if any(request.done() for request in requests):
            return
        await asyncio.sleep(0.02)


async def withdrawn(requests: list[asyncio.Task]) -> None:
    for request in requests:
        request.cancel()
    await asyncio.gather(*requests, return_exceptions=True)


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({}, "prompt", "prompt: give one of prompt, messages, text and prompt_token_ids"),
        ({"prompt": "a", "text": "b"}, "prompt", "give one of prompt, messages, text"),
        ({"prompt": "a", "max_tokens": 0}, "max_tokens", "max_tokens: 0 only with prompt_logprobs"),
        ({"prompt": "a", "messages": [{"role": "user", "content": "a"}]}, "prompt", "give one of"),
        ({"messages": [{"role": "assistant", "content": "a"}]}, "messages", "has no user turn"),
        (
            {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]},
            "messages",
            "the user's or a tool's reply",
        ),
        (
            {"messages": [{"role": "user", "content": "q"}], "tools": [{"type": "x"}]},
            "tools.0.type",
            "'function'",
        ),
        ({"prompt": "a", "tools": []}, "tools", "only with messages"),
        ({"prompt": "a", "n": 0}, "n", "greater than or equal to 1"),
        ({"prompt": "a", "max_tokens": 100_000}, "max_tokens", "less than or equal"),
        ({"prompt": "a", "compare": ["teacher", "teacher"]}, "compare", "at most once"),
        ({"prompt": "a", "compare": ["judge"]}, "compare.0", "'teacher' or 'base'"),
        ({"prompt": "a", "checkpoint": 3}, "checkpoint", "steps: 2"),
        ({"prompt": "a", "checkpoint": "latest"}, "checkpoint", "'final' or a step number"),
        ({"prompt": "a"}, "checkpoint", "has no final weights"),
    ],
)
async def test_a_bad_request_is_a_422_that_says_what_is_wrong(
    client, key, sampled, body, param, words
):
    job = await sampled()
    response = await client.post(f"/v1/jobs/{job['id']}/playground", json=body, headers=auth(key))
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["param"] == param and words in error["message"], error


async def test_a_stored_teacher_path_to_another_teams_weights_is_refused(
    client, key, make_key, session, submit
):
    theirs = await submit(await make_key())
    await claim_job(session, theirs["id"], "w", heartbeat_timeout=60)
    await record_checkpoint(session, theirs["id"], "w", 2, "sampler", "trio://x/run/2")
    # Stored past the submission check, as a job submitted before it existed may be.
    spec = small_spec(backend="trio", teacher={"model_path": "trio://x/run/2"})
    ours = (await create_job(session, key.team.id, JobSpec.model_validate(spec))).job
    await claim_job(session, ours.id, "w", heartbeat_timeout=60)
    await record_checkpoint(session, ours.id, "w", 2, "sampler", "trio://x/ours/2")
    body = {"prompt": "a", "checkpoint": 2, "compare": ["teacher"]}
    response = await client.post(f"/v1/jobs/{ours.id}/playground", json=body, headers=auth(key))
    assert response.status_code == 422, response.text
    assert response.json()["error"]["param"] == "teacher.model_path"


async def test_another_teams_job_is_a_404(client, make_key, sampled):
    job = await sampled()
    body = {"prompt": "a", "checkpoint": 2}
    response = await client.post(
        f"/v1/jobs/{job['id']}/playground", json=body, headers=auth(await make_key())
    )
    assert response.status_code == 404


async def test_a_request_no_worker_takes_is_a_504_and_is_withdrawn(
    client, key, sampled, redis, queue_name
):
    job = await sampled()
    body = {"prompt": "a", "checkpoint": 2, "timeout_seconds": 0.3}
    response = await client.post(f"/v1/jobs/{job['id']}/playground", json=body, headers=auth(key))

    assert response.status_code == 504, response.text
    error = response.json()["error"]
    assert (
        error["code"] == "worker_timeout" and "no worker answered within 0.3 s" in error["message"]
    )
    assert await redis.zcard(quick_queue(queue_name)) == 0


async def test_without_redis_the_playground_is_a_503(key, sampled, settings):
    job = await sampled()
    async with serve(settings.model_copy(update={"redis_url": CLOSED_REDIS_URL})) as http:
        response = await http.post(
            f"/v1/jobs/{job['id']}/playground",
            json={"prompt": "a", "checkpoint": 2},
            headers=auth(key),
        )
    assert response.status_code == 503 and response.json()["error"]["code"] == "queue_unavailable"


async def test_more_waits_than_the_database_pool_holds_leave_it_free(
    settings, key, make_key, session, submit, sampled, redis, queue_name
):
    """Playground samples and PyTRIO downloads waiting for a worker, one more than a
    Postgres pool's connections: another team's request still answers meanwhile."""
    count = settings.db_pool_size + settings.db_max_overflow + 1
    job = await sampled()
    trio = await submit(backend="trio")
    await claim_job(session, trio["id"], "w", heartbeat_timeout=60)
    for step in range(count // 2):
        await record_checkpoint(session, trio["id"], "w", step, "sampler", f"trio://w/{step}")
    sample = {"prompt": "a", "checkpoint": 2, "timeout_seconds": 30}
    async with serve(settings.model_copy(update={"team_max_waiting": count})) as http:
        listed = await http.get(f"/v1/jobs/{trio['id']}/checkpoints", headers=auth(key))
        downloads = [
            http.get(f"/v1/jobs/{trio['id']}/checkpoints/{saved['id']}/download", headers=auth(key))
            for saved in listed.json()["data"]
        ]
        samples = [
            http.post(f"/v1/jobs/{job['id']}/playground", json=sample, headers=auth(key))
            for _ in range(count - len(downloads))
        ]
        requests = [asyncio.create_task(call) for call in downloads + samples]
        await all_waiting(redis, queue_name, requests)
        other = await http.get("/v1/jobs", headers=auth(await make_key()))
        ended = [request for request in requests if request.done()]
        await withdrawn(requests)
    assert other.status_code == 200, other.text
    assert not ended, "the other request answered while all of them waited"


async def test_past_the_teams_bound_a_wait_is_a_429_with_retry_after(
    settings, key, make_key, sampled, submit, session, redis, queue_name
):
    job = await sampled()
    theirs = await make_key()
    their_job = await submit(as_key=theirs, loop={"steps": 4})
    await claim_job(session, their_job["id"], "w", heartbeat_timeout=60)
    await record_checkpoint(session, their_job["id"], "w", 2, "sampler", "/w/2")
    body = {"prompt": "a", "checkpoint": 2, "timeout_seconds": 30}
    url = f"/v1/jobs/{job['id']}/playground"
    async with serve(settings.model_copy(update={"team_max_waiting": 2})) as http:
        requests = [
            asyncio.create_task(http.post(url, json=body, headers=auth(key))) for _ in range(2)
        ]
        await all_waiting(redis, queue_name, requests)
        refused = await http.post(url, json=body, headers=auth(key))
        checkpoints = await http.get(f"/v1/jobs/{job['id']}/checkpoints", headers=auth(key))
        download = f"/v1/jobs/{job['id']}/checkpoints/{checkpoints.json()['data'][0]['id']}"
        refused_download = await http.get(f"{download}/download", headers=auth(key))
        their_url = f"/v1/jobs/{their_job['id']}/playground"
        requests.append(asyncio.create_task(http.post(their_url, json=body, headers=auth(theirs))))
        await all_waiting(redis, queue_name, requests)
        ended = [request for request in requests if request.done()]
        await withdrawn(requests)
    for answer in (refused, refused_download):
        assert answer.status_code == 429, answer.text
        assert answer.headers["retry-after"] == "5"
        assert answer.json()["error"]["code"] == "too_many_requests"
        assert "as it may (2, OPD_TEAM_MAX_WAITING)" in answer.json()["error"]["message"]
    assert not ended, "the other team's request waits in a place of its own"


async def test_the_old_route_name_sample_still_answers_as_the_playground(client, key, sampled):
    job = await sampled()
    body = {"prompt": "a", "checkpoint": 3}
    old = await client.post(f"/v1/jobs/{job['id']}/sample", json=body, headers=auth(key))
    new = await client.post(f"/v1/jobs/{job['id']}/playground", json=body, headers=auth(key))
    assert old.status_code == new.status_code == 422 and old.json() == new.json()
    document = (await client.get("/openapi.json")).json()["paths"]
    assert document["/v1/jobs/{job_id}/sample"]["post"]["deprecated"] is True


async def test_a_request_waits_in_a_place_per_completion_it_asks_for(
    settings, key, sampled, redis, queue_name
):
    """n 2 of the checkpoint and the teacher: 4 completions, all 4 of the team's places."""
    job = await sampled()
    url = f"/v1/jobs/{job['id']}/playground"
    body = {"prompt": "a", "checkpoint": 2, "timeout_seconds": 30}
    async with serve(settings.model_copy(update={"team_max_waiting": 4})) as http:
        compared = body | {"n": 2, "compare": ["teacher"]}
        requests = [asyncio.create_task(http.post(url, json=compared, headers=auth(key)))]
        await all_waiting(redis, queue_name, requests)
        refused = await http.post(url, json=body, headers=auth(key))
        ended = [request for request in requests if request.done()]
        await withdrawn(requests)
    assert not ended
    assert refused.status_code == 429, refused.text
    assert "as it may (4, OPD_TEAM_MAX_WAITING)" in refused.json()["error"]["message"]


async def test_a_request_for_more_completions_than_a_team_may_have_waiting_is_a_422(
    settings, key, sampled, redis, queue_name
):
    job = await sampled()
    body = {"prompt": "a", "checkpoint": 2, "n": 3, "compare": ["teacher"], "timeout_seconds": 0.3}
    async with serve(settings.model_copy(update={"team_max_waiting": 4})) as http:
        response = await http.post(f"/v1/jobs/{job['id']}/playground", json=body, headers=auth(key))
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert (error["code"], error["param"]) == ("too_many_completions", "n")
    assert error["message"] == (
        "this request asks for 6 completions (n 3 x 2 model(s)); a team may have at most 4 "
        "waiting for a worker at once (OPD_TEAM_MAX_WAITING): send them in requests of at "
        "most 4 completions each"
    )
    assert await redis.zcard(quick_queue(queue_name)) == 0
