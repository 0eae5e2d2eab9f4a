"""Budgets at the doors that sample a job's weights (issue 47 items 4, 6 and 7), through
the API and a quick worker on the PyTRIO fake, on SQLite and Postgres: requests racing at
the limit each hold their most before they start, so the team never spends past its
budget (they all went through before, far past it); a worker scoring for a job of the team
(a job token) is neither refused by the door nor counted twice."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from app.auth.job_tokens import JobTokens
from app.jobs.store import claim_job
from tests.app.conftest import auth, small_spec
from tests.worker.service.test_quick import (  # noqa: F401 (fixtures)
    MESSAGES,
    SPEC,
    job_spec,
    pytrio_fake,
)

CALLS = 12


async def budget(api, admin, team: str, tokens: int | None = None) -> dict[str, Any]:
    """The team's budget (set to `tokens` first when given)."""
    url = f"/v1/teams/{team}/budget"
    if tokens is not None:
        assert (await api.put(url, json={"tokens": tokens}, headers=auth(admin))).is_success
    return (await api.get(url, headers=auth(admin))).json()


def door(name: str, job_id: int) -> tuple[str, dict[str, Any]]:
    model = f"job-{job_id}"
    if name == "completions":
        return "/v1/completions", {"model": model, "prompt": "1 + 1 =", "max_tokens": 16, "n": 4}
    if name == "chat":
        body = {"model": model, "messages": MESSAGES, "max_tokens": 16, "n": 4}
        return "/v1/chat/completions", body
    return f"/v1/jobs/{job_id}/playground", {"prompt": "1 + 1 =", "max_tokens": 16, "n": 4}


@pytest.mark.parametrize("name", ["completions", "chat", "playground"])
async def test_requests_racing_at_the_limit_never_spend_past_the_budget(
    api, key, make_key, trained, name
):
    admin = await make_key(admin=True)
    spent = (await budget(api, admin, key.team.name, 10**9))["used"]
    limit = spent + 200  # room for one request's most (its prompt and 4 x 16 tokens)
    await budget(api, admin, key.team.name, limit)
    url, body = door(name, trained["id"])

    answers = await asyncio.gather(
        *(api.post(url, json=body, headers=auth(key)) for _ in range(CALLS))
    )

    codes = sorted(answer.status_code for answer in answers)
    after = await budget(api, admin, key.team.name)
    assert after["used"] <= limit, (codes, after)
    assert after["held"] == 0 and codes[0] == 200 and codes[-1] == 429, codes
    refused = next(answer.json() for answer in answers if answer.status_code == 429)
    assert refused["error"]["code"] == "budget_exceeded" and refused["budget"]["budget"] == limit
    assert "this request may use up to" in refused["error"]["message"]


async def test_a_worker_scoring_for_a_job_spends_as_that_job(
    api, key, make_key, trained, settings, session
):
    """A job whose teacher is this service: its scoring requests are not refused at the
    door when the budget is spent (its own step check pauses it), and add nothing to the
    served job's usage (its steps record them as usage/teacher_tokens)."""
    admin = await make_key(admin=True)
    learner = (await api.post("/v1/jobs", json=small_spec(), headers=auth(key))).json()
    await claim_job(session, learner["id"], "w", heartbeat_timeout=60)
    token = JobTokens.of(settings).issue(key.team.id, learner["id"], time.time())
    spent = (await budget(api, admin, key.team.name, 1))["used"]
    served = (await api.get(f"/v1/jobs/{trained['id']}", headers=auth(key))).json()["usage"]

    body = {"model": f"job-{trained['id']}", "prompt": "1 + 1 =", "max_tokens": 4, "logprobs": 0}
    scored = await api.post("/v1/completions", json=body, headers=auth_token(token))
    by_team = await api.post("/v1/completions", json=body, headers=auth(key))

    assert scored.status_code == 200, scored.text
    assert by_team.status_code == 429 and by_team.json()["error"]["code"] == "budget_exceeded"
    assert (await budget(api, admin, key.team.name))["used"] == spent
    after = (await api.get(f"/v1/jobs/{trained['id']}", headers=auth(key))).json()["usage"]
    assert after == served


def auth_token(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}
