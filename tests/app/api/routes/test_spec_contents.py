"""What a spec and a sweep may contain, through the real API on SQLite and Postgres: finite
numbers only (JSON has no others, and Postgres refuses them in a JSON column), a range typed
like its field, the backend, models and dataset named (a model name its backend cannot load
refused with the nearest preset), and a stored spec or definition of bounded size. Each
refusal is a 4xx naming the field, and nothing is stored."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from app.core.config import Settings
from tests.app.conftest import auth, serve, small_spec

JSON = {"content-type": "application/json"}


def sweep_of(base: dict[str, Any] | None = None, **fields: Any) -> dict[str, Any]:
    return {
        "name": "s",
        "base": base or small_spec(),
        "parameters": {"optim.learning_rate": {"values": [1e-3, 3e-3]}},
        "method": "grid",
        "metric": {"name": "opd/reverse_kl_mean", "goal": "minimize"},
    } | fields


async def nothing_stored(client: httpx.AsyncClient, key) -> None:
    for listing in ("/v1/jobs", "/v1/sweeps"):
        assert (await client.get(listing, headers=auth(key))).json()["data"] == []


async def post_raw(client: httpx.AsyncClient, key, path: str, body: dict[str, Any]):
    """POST `body` as Python's json writes it: NaN and Infinity as bare words."""
    return await client.post(path, content=json.dumps(body), headers=auth(key) | JSON)


@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan")], ids=str)
@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/jobs", small_spec(optim={"grad_clip_norm": "X"}), "optim.grad_clip_norm"),
        ("/v1/jobs", small_spec(metadata={"k": "X"}), "metadata.k"),
        (
            "/v1/sweeps",
            sweep_of(parameters={"optim.grad_clip_norm": {"values": [1.0, "X"]}}),
            "parameters.optim.grad_clip_norm.values.1",
        ),
        (
            "/v1/sweeps",
            sweep_of(
                method="random",
                parameters={"optim.learning_rate": {"min": "X", "max": 1e-3}},
            ),
            "parameters.optim.learning_rate.min",
        ),
        (
            "/v1/sweeps",
            sweep_of(small_spec(optim={"grad_clip_norm": "X"})),
            "base.optim.grad_clip_norm",
        ),
        ("/v1/sweeps", sweep_of(small_spec(eval="X")), "base.eval"),
    ],
)
async def test_a_non_finite_number_anywhere_in_a_body_is_a_422_naming_it(
    client, key, path, body, param, value
):
    raw = json.dumps(body).replace('"X"', json.dumps(value))
    response = await client.post(path, content=raw, headers=auth(key) | JSON)

    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert (error["code"], error["param"]) == ("invalid_request", param)
    assert "NaN and Infinity are not JSON numbers" in error["message"]
    await nothing_stored(client, key)


async def test_a_clone_patch_with_a_non_finite_number_is_refused(client, key, submit):
    job = await submit()
    patch = {"optim": {"learning_rate": float("nan")}}
    response = await post_raw(client, key, f"/v1/jobs/{job['id']}/clone", patch)
    assert response.status_code == 422, response.text
    assert response.json()["error"]["param"] == "optim.learning_rate"


async def test_the_words_nan_and_infinity_in_a_string_are_only_text(client, key):
    spec = small_spec(metadata={"note": "NaN, Infinity"})
    response = await post_raw(client, key, "/v1/jobs", spec)
    assert response.status_code == 201, response.text
    assert response.json()["spec"]["metadata"] == {"note": "NaN, Infinity"}


@pytest.mark.parametrize("distribution", ["uniform", "log_uniform"])
async def test_a_fractional_range_over_a_whole_number_field_is_refused(client, key, distribution):
    ranged = {"loop.steps": {"min": 1, "max": 4, "distribution": distribution}}
    response = await client.post(
        "/v1/sweeps", json=sweep_of(method="random", parameters=ranged), headers=auth(key)
    )

    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["param"] == "parameters.loop.steps"
    assert "2.5: should be a whole number, not 2.5" in error["message"]
    assert "needs distribution: int_uniform" in error["message"]
    await nothing_stored(client, key)


async def test_an_int_uniform_range_over_a_whole_number_field_is_accepted(client, key):
    ranged = {"loop.steps": {"min": 1, "max": 4, "distribution": "int_uniform"}}
    response = await client.post(
        "/v1/sweeps", json=sweep_of(method="random", parameters=ranged), headers=auth(key)
    )
    assert response.status_code == 201, response.text


async def test_an_empty_spec_is_refused_naming_what_it_must_name(client, key):
    response = await client.post("/v1/jobs", json={}, headers=auth(key))

    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["param"] == "backend"
    for field in ("backend", "student", "teacher", "dataset"):
        assert f"{field}: this field is required" in error["message"]
    await nothing_stored(client, key)


@pytest.mark.parametrize(
    ("groups", "param", "says"),
    [
        (
            {"teacher": {"base_model": "tiny-teachr"}},
            "teacher.base_model",
            "did you mean tiny-teacher?",
        ),
        (
            {"student": {"base_model": "tiny-studnet"}},
            "student.base_model",
            "did you mean tiny-student?",
        ),
        (
            {"backend": "trio", "teacher": {"base_model": "tiny-teacher"}},
            "teacher.base_model",
            "tiny-teacher is a preset of backend: local",
        ),
        (
            {
                "teachers": {"add": {"base_model": "arith-teacher-ad"}},
                "dataset": None,
                "datasets": [{"name": "d", "source": "arithmetic", "teacher": "add"}],
            },
            "teachers.add.base_model",
            "did you mean arith-teacher-add?",
        ),
    ],
)
async def test_a_model_name_its_backend_cannot_load_is_refused_with_the_nearest_preset(
    client, key, groups, param, says
):
    body = {k: v for k, v in (small_spec() | groups).items() if v is not None}
    response = await client.post("/v1/jobs", json=body, headers=auth(key))

    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["param"] == param and says in error["message"], error
    await nothing_stored(client, key)


@pytest.mark.parametrize(
    "groups",
    [
        {"student": {"base_model": "tiny-student"}, "teacher": {"base_model": "tiny-teacher"}},
        {"backend": "trio", "teacher": {"base_model": "teacher/model"}},
        {"backend": "tinker", "student": {"base_model": "meta-llama/Llama-3.1-8B"}},
    ],
)
async def test_presets_and_hub_ids_are_accepted(client, key, groups):
    response = await client.post("/v1/jobs", json=small_spec(**groups), headers=auth(key))
    assert response.status_code == 201, response.text


async def test_a_sweep_over_model_names_is_checked_at_creation(client, key):
    names = {"teacher.base_model": {"values": ["tiny-teacher", "tiny-teachr"]}}
    response = await client.post("/v1/sweeps", json=sweep_of(parameters=names), headers=auth(key))
    assert response.status_code == 422, response.text
    assert "did you mean tiny-teacher?" in response.json()["error"]["message"]
    await nothing_stored(client, key)


SMALL_CAP = 16 * 1024


@pytest.fixture
async def capped(settings: Settings):
    """The API storing specs and sweep definitions of at most SMALL_CAP bytes."""
    async with serve(settings.model_copy(update={"max_spec_bytes": SMALL_CAP})) as http:
        yield http


async def test_a_spec_or_definition_larger_than_the_cap_is_a_413(capped, key):
    prompts = [f"What is {n} + {n}?" for n in range(1000)]
    large = small_spec(dataset={"source": "inline", "prompts": prompts})
    assert len(json.dumps(large)) > SMALL_CAP

    job = await capped.post("/v1/jobs", json=large, headers=auth(key))
    assert job.status_code == 413, job.text
    error = job.json()["error"]
    assert error["code"] == "too_large_to_store"
    assert "the spec is" in error["message"] and "OPD_MAX_SPEC_BYTES" in error["message"]

    values = [f"{n:0>200}" for n in range(30)]  # 240 values in all, under OPD_SWEEP_MAX_VALUES
    parameters = {f"metadata.k{i}": {"values": values} for i in range(8)}
    definition = sweep_of(method="random", parameters=parameters)
    assert SMALL_CAP < len(json.dumps(definition)) < 64 * 1024  # under the body limit
    sweep = await capped.post("/v1/sweeps", json=definition, headers=auth(key))
    assert sweep.status_code == 413, sweep.text
    assert "the sweep's definition is" in sweep.json()["error"]["message"]
    await nothing_stored(capped, key)

    assert (await capped.post("/v1/jobs", json=small_spec(), headers=auth(key))).status_code == 201
