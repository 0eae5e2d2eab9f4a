"""A team's budget on real processes (an API, a worker, SQLite and Postgres): the job that
crosses the limit mid-run pauses at the next step boundary with its row and state intact,
the team spends at most one step past its limit, a new job is a 429 `budget_exceeded`,
and once an admin raises the budget the job resumes by itself and its curve equals an
uninterrupted run's."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.e2e.conftest import Service
from tests.e2e.test_faults import SPEC, assert_same_as_uninterrupted, events, foreground_run

USAGE = ("usage/sampled_tokens", "usage/teacher_tokens", "usage/trained_tokens")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[int, dict[str, float]]:
    return foreground_run(tmp_path_factory, SPEC)


def step_tokens(row: dict[str, Any]) -> int:
    return sum(round(row[name]) for name in USAGE)


def put_budget(service: Service, admin: str, tokens: int) -> httpx.Response:
    return httpx.put(
        f"{service.url}/v1/teams/e2e/budget",
        json={"tokens": tokens},
        headers={"Authorization": f"Bearer {admin}"},
        timeout=30,
    )


# Postgres, as teams share one in production; the budget's queries run on both databases
# in tests/app (this end to end is the suite's longest pair).
@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
def test_a_job_crossing_its_budget_pauses_at_the_boundary_and_resumes_exactly(
    service, uninterrupted
):
    admin = service.opd("keys", "create", "--team", "ops", "--admin").stdout.strip()
    per_step = [step_tokens(uninterrupted[step]) for step in sorted(uninterrupted)]
    limit = sum(per_step[:6]) + per_step[6] // 2  # runs out during step 6
    assert put_budget(service, admin, limit).status_code == 200
    service.start_worker()
    job = service.submit(SPEC)

    paused = service.wait(job["id"], lambda j: j["status"] == "paused")

    assert paused["stop_reason"] == "budget"
    assert paused["last_state_step"] == paused["steps_done"] == 7  # the boundary after step 6
    spent = sum(paused["usage"][f"{name}_tokens"] for name in ("sampled", "teacher", "trained"))
    overshoot = spent - limit
    print(f"budget {limit} tokens, spent {spent}: {overshoot / max(per_step):.2f} step over")
    assert 0 <= overshoot <= max(per_step)  # one step per running job at most
    assert "Pausing at the next step boundary" in events(service, job["id"])
    refused = httpx.post(
        f"{service.url}/v1/jobs", json=SPEC, headers={"Authorization": f"Bearer {service.key}"}
    )
    assert refused.status_code == 429
    body = refused.json()
    assert body["error"]["code"] == "budget_exceeded"
    assert body["budget"]["spent"] == spent and body["budget"]["budget"] == limit
    assert int(refused.headers["Retry-After"]) > 0

    assert put_budget(service, admin, 10 * sum(per_step)).status_code == 200
    done = service.wait(job["id"])

    assert done["status"] == "succeeded" and done["stop_reason"] is None
    assert_same_as_uninterrupted(service, job["id"], uninterrupted)
    assert "may spend again" in events(service, job["id"])
