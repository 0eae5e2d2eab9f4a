"""A teacher on an inference server at submission: only the servers the operator lists
(OPD_TEACHER_SERVERS) may be named, by every road a spec takes (a job, a clone); an
objective that needs the teacher's logits, which a server never sends, is refused; the key
is the one the operator bound to the server: a spec that names a variable is refused."""

from __future__ import annotations

from typing import Any

import pytest

from tests.app.api.routes.test_job_input import refused
from tests.app.conftest import auth, small_spec

LISTED = "http://vllm.internal:8000/v1"


def served(url: str = LISTED, **server: Any) -> dict[str, Any]:
    return small_spec(teacher={"server": {"url": url, "model": "Llama-70B"} | server})


@pytest.fixture
def listed(settings):
    settings.teacher_servers = {LISTED: "VLLM_KEY", "http://sglang.internal:30000/v1/": None}
    return settings


async def test_a_listed_server_is_accepted_naming_no_key(client, key, listed):
    spec = served(LISTED + "/", batch_size=16)
    response = await client.post("/v1/jobs", json=spec, headers=auth(key))

    assert response.status_code == 201, response.text
    server = response.json()["spec"]["teacher"]["server"]
    assert server["url"] == LISTED and "api_key_env" not in server
    assert server["batch_size"] == 16 and server["max_retries"] == 4
    sglang = served("http://sglang.internal:30000/v1", model="m")
    assert (await client.post("/v1/jobs", json=sglang, headers=auth(key))).status_code == 201


@pytest.mark.parametrize(
    "url", ["http://169.254.169.254/latest", "http://vllm.internal:8000", LISTED + "/admin"]
)
async def test_a_server_outside_the_list_is_refused_naming_the_allowed_ones(
    client, key, redis, queue_name, listed, url
):
    error = await refused(client, key, redis, queue_name, served(url))
    assert error["param"] == "teacher.server.url"
    assert url in error["message"] and LISTED in error["message"]
    assert "OPD_TEACHER_SERVERS" in error["message"]


async def test_with_no_list_no_server_is_allowed(client, key, redis, queue_name):
    error = await refused(client, key, redis, queue_name, served())
    assert "none are" in error["message"] and "OPD_TEACHER_SERVERS" in error["message"]


async def test_one_of_several_teachers_on_an_unlisted_server_is_refused(
    client, key, redis, queue_name, listed
):
    teachers = {
        "near": {"server": {"url": LISTED, "model": "a"}},
        "far": {"server": {"url": "http://elsewhere:8000/v1", "model": "b"}},
    }
    spec = small_spec(teachers=teachers, teacher_mixture="mixture")
    error = await refused(client, key, redis, queue_name, spec)
    assert error["param"] == "teachers.far.server.url"


async def test_a_key_variable_under_a_named_teacher_is_refused_too(
    client, key, redis, queue_name, listed
):
    teachers = {
        "near": {"server": {"url": LISTED, "model": "a", "api_key_env": "OPD_TEACHER_KEY"}},
        "far": {"server": {"url": LISTED, "model": "b"}},
    }
    spec = small_spec(teachers=teachers, teacher_mixture="mixture")
    error = await refused(client, key, redis, queue_name, spec)
    assert error["param"] == "teachers.near.server.api_key_env"
    assert "OPD_TEACHER_SERVERS" in error["message"]


def test_the_operator_binds_keys_and_the_old_list_still_reads():
    from app.core.config import Settings

    old = Settings(teacher_servers=[LISTED])
    assert old.teacher_servers == {LISTED: None} and old.teacher_server_key_env(LISTED) is None
    bound = Settings(teacher_servers={LISTED + "/": "VLLM_KEY"})
    assert bound.teacher_server_key_env(LISTED) == "VLLM_KEY"
    with pytest.raises(ValueError, match="environment variable"):
        Settings(teacher_servers={LISTED: "not a name!"})


async def test_a_clone_onto_an_unlisted_server_is_refused(client, key, listed):
    source = await client.post("/v1/jobs", json=served(), headers=auth(key))
    assert source.status_code == 201, source.text
    patch = {"teacher": {"server": {"url": "http://attacker.example/v1"}}}
    response = await client.post(
        f"/v1/jobs/{source.json()['id']}/clone", json=patch, headers=auth(key)
    )
    assert response.status_code == 422, response.text
    assert response.json()["error"]["param"] == "teacher.server.url"


@pytest.mark.parametrize(
    ("change", "param", "words"),
    [
        (
            {"loop": {"steps": 3, "objective": {"kind": "reverse_kl"}}},
            "teacher.server",
            "whole distribution",
        ),
        (
            {"eval": {"holdout": 1, "teacher_baseline": True}},
            "eval.teacher_baseline",
            "only scores",
        ),
        (
            {
                "backend": "tinker",
                "student": {"base_model": "Qwen/Qwen3-8B"},
                "loop": {
                    "steps": 3,
                    "objective": {"kind": "forward_kl", "top_k": 20, "tail": False},
                },
            },
            "teacher.server.protocol",
            "prompt_logprobs",
        ),
        (
            {"teacher": {"server": {"url": LISTED}}},
            "teacher.server.model",
            "this field is required",
        ),
        (
            {"teacher": {"server": {"url": "http://u:p@vllm.internal:8000/v1", "model": "m"}}},
            "teacher.server.url",
            "without credentials",
        ),
        (
            {"teacher": {"server": {"url": LISTED, "model": "m", "api_key_env": "sk-abc!"}}},
            "teacher.server.api_key_env",
            "OPD_TEACHER_SERVERS",
        ),
        (
            {
                "teacher": {
                    "server": {"url": LISTED, "model": "m", "api_key_env": "AWS_SECRET_ACCESS_KEY"}
                }
            },
            "teacher.server.api_key_env",
            "the operator binds each server to its key in OPD_TEACHER_SERVERS",
        ),
        (
            {"teacher": {"server": {"url": LISTED, "model": "m", "api_key_env": None}}},
            "teacher.server.api_key_env",
            "OPD_TEACHER_SERVERS",
        ),
        (
            {"teacher": {"server": {"url": LISTED, "model": "m", "batch_size": 0}}},
            "teacher.server.batch_size",
            "greater than or equal to 1",
        ),
        (
            {"teacher": {"model_path": "/x", "server": {"url": LISTED, "model": "m"}}},
            "teacher.server",
            "not both",
        ),
    ],
)
async def test_what_a_server_teacher_cannot_do_is_refused(
    client, key, redis, queue_name, listed, change, param, words
):
    error = await refused(client, key, redis, queue_name, served() | change)
    assert error["param"] == param and words in error["message"], error


async def test_the_playground_does_not_load_a_server_teacher(client, key, listed):
    job = await client.post("/v1/jobs", json=served(), headers=auth(key))
    assert job.status_code == 201, job.text
    asked = {"messages": [{"role": "user", "content": "2 + 3?"}], "compare": ["teacher"]}
    response = await client.post(
        f"/v1/jobs/{job.json()['id']}/sample", json=asked, headers=auth(key)
    )
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["param"] == "compare" and LISTED in error["message"]
    assert "ask that server" in error["message"]
