"""The playground's API side with no worker running: bad requests are 422s naming the
field, another team's job is a 404, and a request no worker takes is a 504 and is
withdrawn from the queue. (With workers: tests/worker/service/test_quick.py, and real
processes in tests/e2e/test_playground.py.)"""

from __future__ import annotations

from typing import Any

import pytest

from app.store.jobs import claim_job, create_job
from app.store.records import record_checkpoint
from app.worker_tasks import quick_queue
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


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({}, None, "give either prompt or messages"),
        ({"prompt": "a", "messages": [{"role": "user", "content": "a"}]}, None, "either"),
        ({"messages": [{"role": "assistant", "content": "a"}]}, None, "the user's"),
        ({"prompt": "a", "n": 0}, "n", "greater than or equal to 1"),
        ({"prompt": "a", "max_tokens": 100_000}, "max_tokens", "less than or equal"),
        ({"prompt": "a", "compare": ["teacher", "teacher"]}, None, "at most once"),
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
    response = await client.post(f"/v1/jobs/{job['id']}/sample", json=body, headers=auth(key))
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
    response = await client.post(f"/v1/jobs/{ours.id}/sample", json=body, headers=auth(key))
    assert response.status_code == 422, response.text
    assert response.json()["error"]["param"] == "teacher.model_path"


async def test_another_teams_job_is_a_404(client, make_key, sampled):
    job = await sampled()
    body = {"prompt": "a", "checkpoint": 2}
    response = await client.post(
        f"/v1/jobs/{job['id']}/sample", json=body, headers=auth(await make_key())
    )
    assert response.status_code == 404


async def test_a_request_no_worker_takes_is_a_504_and_is_withdrawn(
    client, key, sampled, redis, queue_name
):
    job = await sampled()
    body = {"prompt": "a", "checkpoint": 2, "timeout_seconds": 0.3}
    response = await client.post(f"/v1/jobs/{job['id']}/sample", json=body, headers=auth(key))

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
            f"/v1/jobs/{job['id']}/sample",
            json={"prompt": "a", "checkpoint": 2},
            headers=auth(key),
        )
    assert response.status_code == 503 and response.json()["error"]["code"] == "queue_unavailable"
