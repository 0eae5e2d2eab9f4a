"""POST /v1/jobs with a self teacher: stored with the student's model, its tokens priced as
teacher tokens at that model, each refusal a 422 naming the field; the playground refuses
a question without the reference answer such a teacher reads."""

from __future__ import annotations

from typing import Any

import pytest

from app.core.config import Settings
from app.core.pricing import Price
from app.jobs.store import claim_job
from app.records.store import record_checkpoint
from tests.app.api.routes.test_job_input import refused
from tests.app.api.routes.test_usage import used
from tests.app.conftest import auth, serve, small_spec

CONTEXT = {
    "system": "Answer with the number only.",
    "examples": [{"user": "1+1?", "assistant": "2"}],
}


def self_spec(**context: Any) -> dict[str, Any]:
    spec = small_spec(student={"base_model": "tiny-student"})
    spec["teacher"] = {"self": CONTEXT | context}
    spec["dataset"] = {"source": "inline", "prompts": ["What is 1 + 1?"], "answers": ["2"]}
    return spec


@pytest.fixture
async def priced_client(settings: Settings):
    prices = [
        Price(backend="local", model="tiny-student", sampled=1.0, scored=3.0),
        Price(backend="local", model="Qwen/Qwen3.6-27B", scored=100.0),
    ]
    async with serve(settings.model_copy(update={"prices": prices})) as http:
        yield http


async def test_a_self_teacher_is_stored_as_the_students_model_and_priced_at_it(
    priced_client, sessions, key
) -> None:
    response = await priced_client.post("/v1/jobs", json=self_spec(), headers=auth(key))
    assert response.status_code == 201, response.text
    job = response.json()
    await used(sessions, job["id"], sampled=1_000_000, scored=1_000_000, trained=0)

    stored = job["spec"]["teacher"]
    assert stored["base_model"] == "tiny-student" and stored["self"]["weights"] == "base"
    usage = (await priced_client.get(f"/v1/jobs/{job['id']}", headers=auth(key))).json()["usage"]
    assert usage["teacher_tokens"] == 1_000_000
    assert usage["estimated_cost"] == pytest.approx(1.0 + 3.0)


@pytest.mark.parametrize(
    ("body", "param", "says"),
    [
        (
            self_spec(weights="current", system=None, examples=[]),
            "teacher.self.weights",
            "is the student itself",
        ),
        (
            self_spec()
            | {"dataset": {"source": "inline", "prompts": ["q"]}}
            | {"teacher": {"self": {"reference": True}}},
            "teacher.self.reference",
            "has none: give its answers",
        ),
        (
            self_spec() | {"teacher": {"self": CONTEXT, "base_model": "tiny-teacher"}},
            "teacher.base_model",
            "leave base_model out",
        ),
        (
            self_spec() | {"eval": {"holdout": 1, "grader": {"regex": "[0-9"}}},
            "eval.grader.regex",
            "is not a regular expression",
        ),
    ],
    ids=["empty-current", "reference-without-answers", "another-model", "bad-regex"],
)
async def test_a_bad_self_teacher_is_a_422_naming_the_field(
    client, key, redis, queue_name, body, param, says
) -> None:
    error = await refused(client, key, redis, queue_name, body)

    assert error["param"] == param and says in error["message"], error


async def test_the_playground_asks_for_the_reference_a_self_teacher_reads(
    client, key, session
) -> None:
    body = self_spec(reference=True)
    job = (await client.post("/v1/jobs", json=body, headers=auth(key))).json()
    await claim_job(session, job["id"], "w", heartbeat_timeout=60)
    await record_checkpoint(session, job["id"], "w", 2, "sampler", "/w/2")
    asked = {"prompt": "What is 2 + 3?", "checkpoint": 2, "compare": ["teacher"]}

    response = await client.post(f"/v1/jobs/{job['id']}/playground", json=asked, headers=auth(key))

    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["param"] == "reference" and "give it as reference" in error["message"]
