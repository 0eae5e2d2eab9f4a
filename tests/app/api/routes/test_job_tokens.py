"""Job tokens (app/auth/job_tokens.py): the worker's way into this service's own
`/v1/completions` for a job whose teacher server is the service itself. A token acts as
the job's team on that route only, while the job runs: another team's model is the same
404 as a model that does not exist, every other route refuses it, and an expired, forged,
altered or ended one is a 401. With real processes: tests/e2e/test_teacher_server.py."""

from __future__ import annotations

import time
from typing import Any

import pytest

from app.auth.job_tokens import JOB_TOKEN_SECONDS, JobTokens
from app.auth.sessions import b64decode, b64encode
from app.jobs.store import fail_job
from tests.app.api.routes.test_openai import assert_openai_error, chat
from tests.app.api.routes.test_openai import saved_job as running_job

saved_job = running_job  # a running job of the caller's team with sampler weights of step 2


def scoring(model: str) -> dict[str, Any]:
    """What a teacher server's client sends: token ids scored, nothing sampled."""
    return {
        "model": model,
        "prompt": [1, 2, 3],
        "max_tokens": 0,
        "echo": True,
        "logprobs": 1,
        "timeout_seconds": 0.3,
    }


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def tokens(settings) -> JobTokens:
    """The keys the API under test signs with (both read OPD_SECRET_KEY or <home>)."""
    return JobTokens.of(settings)


async def test_a_token_scores_with_its_jobs_team_and_not_another_teams_model(
    client, key, make_key, saved_job, tokens
):
    """Beta's running job, through the service's own /v1: beta's model is served (no worker
    here: the wait ends in a 504, past every check of the caller), alpha's is not found."""
    alpha = await saved_job()
    beta = await saved_job(as_key=await make_key())
    token = tokens.issue(beta["team_id"], beta["id"], time.time())
    ours = await client.post(
        "/v1/completions", json=scoring(f"job-{beta['id']}@step-2"), headers=bearer(token)
    )
    theirs = await client.post(
        "/v1/completions", json=scoring(f"job-{alpha['id']}@step-2"), headers=bearer(token)
    )
    missing = await client.post(
        "/v1/completions", json=scoring(f"job-{alpha['id'] + 1000}@step-2"), headers=bearer(token)
    )

    assert "no worker answered" in assert_openai_error(ours, 504, "server_error", "worker_timeout")
    refused = assert_openai_error(theirs, 404, "invalid_request_error", "model_not_found", "model")
    absent = assert_openai_error(missing, 404, "invalid_request_error", "model_not_found", "model")
    assert refused == absent.replace(str(alpha["id"] + 1000), str(alpha["id"]))


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "/v1/jobs", None),
        ("GET", "/v1/jobs/{job}", None),
        ("GET", "/v1/jobs/{job}/events", None),
        ("POST", "/v1/jobs/{job}/cancel", {}),
        ("POST", "/v1/chat/completions", chat("job-{job}@step-2")),
        ("GET", "/v1/models", None),
        ("GET", "/v1/models/job-{job}@step-2", None),
        ("GET", "/v1/keys", None),
        ("GET", "/v1/files", None),
    ],
)
async def test_a_token_is_refused_on_every_other_route(
    client, saved_job, tokens, method, path, body
):
    job = await saved_job()
    token = tokens.issue(job["team_id"], job["id"], time.time())
    url = path.format(job=job["id"])
    sent = body and body | {"model": body["model"].format(job=job["id"])} if body else body
    response = await client.request(method, url, json=sent, headers=bearer(token))

    assert response.status_code == 403, response.text
    assert "accepted by POST /v1/completions only" in response.text


async def test_an_expired_forged_altered_or_ended_token_is_a_401(
    client, saved_job, tokens, session, make_key
):
    job = await saved_job()
    team, job_id, now = job["team_id"], job["id"], time.time()
    model = f"job-{job_id}@step-2"
    genuine = tokens.issue(team, job_id, now)
    payload, signature = genuine.removeprefix("opdjob_").split(".")
    claims = b64decode(payload).decode().replace(f'"t":{team}', f'"t":{team + 1}')
    other_team = (await make_key()).team.id
    refused = {
        "expired": tokens.issue(team, job_id, now - JOB_TOKEN_SECONDS - 1),
        "forged": JobTokens((b"not the service's key".ljust(32),)).issue(team, job_id, now),
        "altered": f"opdjob_{b64encode(claims.encode())}.{signature}",
        "unsigned": f"opdjob_{payload}.",
        "garbled": "opdjob_%%%.%%%",
        "another team's job": tokens.issue(other_team, job_id, now),
    }
    for what, token in refused.items():
        response = await client.post("/v1/completions", json=scoring(model), headers=bearer(token))
        assert response.status_code == 401, (what, response.text)
    await fail_job(session, job_id, "w", "internal_error", "ended")
    ended = await client.post("/v1/completions", json=scoring(model), headers=bearer(genuine))
    assert ended.status_code == 401 and "not running" in ended.text, ended.text
