"""`sampling.engine: vllm` at submission: a 422 naming OPD_VLLM_SERVERS while no server the
operator named serves the student's base model; accepted once one does, a self teacher's
too (it scores on the same server); refused with a backend vLLM cannot sample for, or a self
teacher of current weights beside an objective that reads the teacher's whole distribution
in the trainer."""

from __future__ import annotations

from tests.app.api.routes.test_job_input import refused
from tests.app.conftest import auth, small_spec


def on_vllm(**overrides: object) -> dict:
    spec = small_spec(**overrides)
    return spec | {"sampling": spec.get("sampling", {}) | {"engine": "vllm"}}


async def test_no_server_for_the_student_is_a_422_naming_the_setting(
    client, key, redis, queue_name, settings
):
    settings.vllm_servers = {"other-model": "http://127.0.0.1:8001/v1"}
    error = await refused(client, key, redis, queue_name, on_vllm())
    assert error["param"] == "sampling.engine"
    assert "OPD_VLLM_SERVERS" in error["message"] and "other-model" in error["message"]


async def test_a_named_server_for_the_student_admits_the_job(client, key, settings):
    spec = on_vllm()
    settings.vllm_servers = {spec["student"]["base_model"]: "http://127.0.0.1:8001/v1"}
    response = await client.post("/v1/jobs", json=spec, headers=auth(key))
    assert response.status_code == 201, response.text
    assert response.json()["spec"]["sampling"]["engine"] == "vllm"
    default = await client.post("/v1/jobs", json=small_spec(), headers=auth(key))
    assert default.json()["spec"]["sampling"]["engine"] == "local"


async def test_a_rank_above_the_servers_limit_is_a_422_naming_the_limit(
    client, key, redis, queue_name, settings
):
    """vLLM pads every adapter to its server's --max-lora-rank, so the operator serves the
    ranks the jobs train and says so (OPD_VLLM_MAX_LORA_RANKS); a larger rank is refused
    at submission, not when the job loads its first adapter."""
    base = small_spec()["student"]["base_model"]
    settings.vllm_servers = {base: "http://127.0.0.1:8001/v1"}
    settings.vllm_max_lora_ranks = {base: 16, "other-model": 64}
    error = await refused(client, key, redis, queue_name, on_vllm(student={"lora_rank": 32}))
    assert error["param"] == "student.lora_rank"
    assert "--max-lora-rank 16" in error["message"] and "lora_rank 16 or less" in error["message"]
    for admitted in (on_vllm(student={"lora_rank": 16}), small_spec(student={"lora_rank": 32})):
        response = await client.post("/v1/jobs", json=admitted, headers=auth(key))
        assert response.status_code == 201, response.text


async def test_vllm_samples_for_the_local_backend_only(client, key, redis, queue_name):
    error = await refused(client, key, redis, queue_name, on_vllm(backend="trio"))
    assert error["param"] == "sampling.engine" and "local backend only" in error["message"]


SELF = {"self": {"system": "Answer with the number only."}}


async def test_a_self_teacher_scores_on_the_students_server(client, key, settings):
    spec = on_vllm() | {"teacher": SELF}
    settings.vllm_servers = {spec["student"]["base_model"]: "http://127.0.0.1:8001/v1"}
    response = await client.post("/v1/jobs", json=spec, headers=auth(key))
    assert response.status_code == 201, response.text
    assert response.json()["spec"]["teacher"]["self"]["weights"] == "base"


LOGIT_LEVEL = {"loop": {"steps": 3, "objective": {"kind": "reverse_kl"}}}


async def test_a_base_self_teacher_with_a_logit_level_objective_is_read_by_the_trainer(
    client, key, settings
):
    """The trainer reads a logit-level objective's teacher itself: the base weights it
    holds, whatever engine sampled the tokens."""
    spec = on_vllm(**LOGIT_LEVEL) | {"teacher": SELF}
    settings.vllm_servers = {spec["student"]["base_model"]: "http://127.0.0.1:8001/v1"}
    response = await client.post("/v1/jobs", json=spec, headers=auth(key))
    assert response.status_code == 201, response.text


async def test_a_current_self_teacher_with_a_logit_level_objective_is_refused(
    client, key, redis, queue_name, settings
):
    """...but not a sampler's weights on vLLM."""
    current = {"self": SELF["self"] | {"weights": "current"}}
    spec = on_vllm(**LOGIT_LEVEL) | {"teacher": current}
    settings.vllm_servers = {spec["student"]["base_model"]: "http://127.0.0.1:8001/v1"}
    error = await refused(client, key, redis, queue_name, spec)
    assert error["param"] == "sampling.engine"
    assert "reverse_kl over the full vocabulary reads a self teacher's whole" in error["message"]
    assert "use the self teacher's weights base, objective sampled_reverse_kl" in error["message"]
