"""POST /v1/jobs with several teachers and datasets: accepted as written, each refusal a
422 naming the field, and every dataset file confined to the data root."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.core.config import Settings
from app.core.pricing import Price
from tests.app.api.routes.test_job_input import refused
from tests.app.api.routes.test_usage import used
from tests.app.conftest import auth, serve, small_spec

TEACHERS = {"add": {"base_model": "tiny-teacher"}, "mul": {"base_model": "tiny-teacher"}}


def datasets(mul_teacher: str = "mul") -> list[dict]:
    return [
        {"name": "add", "source": "arithmetic", "ops": ["add"], "teacher": "add"},
        {"name": "mul", "source": "arithmetic", "ops": ["mul"], "teacher": mul_teacher},
    ]


def multi_spec(**overrides) -> dict:
    spec = small_spec(**({"teachers": TEACHERS, "datasets": datasets()} | overrides))
    del spec["dataset"]
    return spec


async def test_a_routed_two_teacher_spec_is_stored_as_written(client, key) -> None:
    response = await client.post("/v1/jobs", json=multi_spec(), headers=auth(key))

    assert response.status_code == 201, response.text
    stored = response.json()["spec"]
    assert stored["teachers"].keys() == TEACHERS.keys()
    assert [d["teacher"] for d in stored["datasets"]] == ["add", "mul"]
    assert stored["teacher_mixture"] == "route"


async def test_a_dataset_routed_to_no_teacher_is_a_422_naming_it(
    client, key, redis, queue_name
) -> None:
    body = multi_spec(datasets=datasets(mul_teacher="div"))

    error = await refused(client, key, redis, queue_name, body)

    assert error["param"] == "datasets.1.teacher"
    assert "names no teacher under teachers (add, mul)" in error["message"]


async def test_each_datasets_file_is_confined_to_the_data_root(
    client, key, redis, queue_name, settings, tmp_path: Path
) -> None:
    settings.data_root.mkdir(parents=True)
    body = multi_spec(
        datasets=[
            datasets()[0],
            {"name": "mul", "source": "file", "path": "../outside.jsonl", "teacher": "mul"},
        ]
    )

    error = await refused(client, key, redis, queue_name, body)

    assert error["param"] == "datasets.1.path"
    assert "points outside the server's data root" in error["message"]


@pytest.fixture
async def priced_client(settings: Settings):
    prices = [
        Price(backend="local", model="tiny-student", sampled=1.0),
        Price(backend="local", model="tiny-teacher", scored=2.0),
        Price(backend="local", model="Qwen/Qwen3.6-27B", scored=100.0),
    ]
    async with serve(settings.model_copy(update={"prices": prices})) as http:
        yield http


async def test_teachers_tokens_are_priced_at_their_model_never_at_the_default(
    priced_client, sessions, key
) -> None:
    shared = multi_spec(student={"base_model": "tiny-student"})
    mixed = multi_spec(
        student={"base_model": "tiny-student"},
        teachers={"add": {"base_model": "tiny-teacher"}, "mul": {"base_model": "tiny-student"}},
    )
    costs = []
    for body in (shared, mixed):
        job = (await priced_client.post("/v1/jobs", json=body, headers=auth(key))).json()
        await used(sessions, job["id"], sampled=1_000_000, scored=1_000_000, trained=0)
        costs.append(
            (await priced_client.get(f"/v1/jobs/{job['id']}", headers=auth(key))).json()["usage"]
        )
    rows = (await priced_client.get("/v1/usage", headers=auth(key))).json()["rows"]

    assert costs[0]["estimated_cost"] == pytest.approx(1.0 + 2.0)
    assert costs[1]["estimated_cost"] is None  # two teacher models: no single price applies
    assert [row["estimated_cost"] for row in rows] == [pytest.approx(3.0), None]


async def test_the_playground_refuses_a_teacher_the_job_does_not_have(client, key) -> None:
    job = (await client.post("/v1/jobs", json=multi_spec(), headers=auth(key))).json()
    body = {"prompt": "What is 2 + 3?", "compare": ["teacher"], "teacher": "div"}

    response = await client.post(f"/v1/jobs/{job['id']}/playground", json=body, headers=auth(key))

    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["param"] == "teacher" and "no teacher 'div' (it has add, mul)" in error["message"]
