"""The quick tasks through the API and a quick arq worker (in process, on the real Redis),
for a job trained on the PyTRIO fake: the playground samples the saved weights PyTRIO
holds, and a checkpoint's archive is fetched once through PyTRIO's REST client."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from arq.worker import Worker

from app.archives import fetched_path
from tests.app.conftest import auth, serve
from tests.fakes import model
from tests.fakes.trio import FakeServiceClient, patch_pytrio
from tests.fakes.trio_rest import FakeRestClient
from worker.service.quick import quick_worker
from worker.service.tasks import WorkerContext, run_job

SPEC = {
    "name": "trio-job",
    "backend": "trio",
    "student": {"base_model": "student/model", "lora_rank": 8},
    "teacher": {"base_model": "teacher/model"},
    "dataset": {"source": "inline", "prompts": ["What is 1 + 1?"], "question_suffix": ""},
    "sampling": {"max_tokens": 6},
    "loop": {"steps": 2, "batch_size": 1, "group_size": 2},
    "trio": {"call_attempts": 1},
}


@pytest.fixture
async def pytrio_fake(monkeypatch) -> FakeServiceClient:
    fake = FakeServiceClient()
    patch_pytrio(monkeypatch, fake)
    return fake


@pytest.fixture
async def api(settings, pytrio_fake) -> AsyncIterator[Any]:
    """The API and, beside it, a worker's quick tasks, sharing the settings."""
    worker = quick_worker(settings, Worker)
    answering = asyncio.create_task(worker.async_run())
    async with serve(settings) as http:
        yield http
    answering.cancel()
    await worker.close()


@pytest.fixture
async def trained(api, key, settings, sessions, queue) -> dict[str, Any]:
    """A trio job submitted through the API and run to its end on the fake."""
    job = (await api.post("/v1/jobs", json=SPEC, headers=auth(key))).json()
    context = WorkerContext(settings, sessions, queue, "worker-1")
    assert await run_job({"opd": context}, job["id"]) == f"job {job['id']}: succeeded"
    return (await api.get(f"/v1/jobs/{job['id']}", headers=auth(key))).json()


async def test_the_playground_samples_the_weights_pytrio_saved(api, key, trained, pytrio_fake):
    body = {"prompt": "What is 1 + 1?", "compare": ["teacher"], "n": 2, "max_tokens": 5}
    url = f"/v1/jobs/{trained['id']}/sample"
    first = await api.post(url, json=body, headers=auth(key))

    assert first.status_code == 200, first.text
    answer = first.json()
    final = trained["final_weights_path"]
    assert answer["checkpoint"]["path"] == final
    opened = [call.args for call in pytrio_fake.calls_named("create_sampling_client")]
    assert {"base_model": "student/model", "model_path": final} in opened
    prompt = model.TOKENIZER.encode(answer["prompt"], add_special_tokens=False)
    student, teacher = pytrio_fake.checkpoints[final].weights, model.digest("base", "teacher/model")
    checkpoint, teacher_output = answer["outputs"]
    assert (checkpoint["model"], teacher_output["model"]) == ("checkpoint", "teacher")
    for completion in checkpoint["completions"]:
        sequence = prompt + completion["token_ids"]
        assert completion["logprobs"] == pytest.approx(
            model.score(student, sequence)[len(prompt) :]
        )
        assert completion["teacher_logprobs"] == pytest.approx(
            model.score(teacher, sequence)[len(prompt) :]
        )
        assert completion["reverse_kl"] == pytest.approx(
            [
                a - b
                for a, b in zip(completion["logprobs"], completion["teacher_logprobs"], strict=True)
            ]
        )

    opened_before = len(opened)
    again = (await api.post(url, json=body, headers=auth(key))).json()
    assert [output["cached"] for output in again["outputs"]] == [True, True]
    assert len(pytrio_fake.calls_named("create_sampling_client")) == opened_before


async def test_a_pytrio_archive_is_fetched_once_and_sent_with_its_sha256(
    api, key, trained, pytrio_fake, settings
):
    listed = (await api.get(f"/v1/jobs/{trained['id']}/checkpoints", headers=auth(key))).json()
    final = next(c for c in listed["data"] if c["kind"] == "final")
    url = f"/v1/jobs/{trained['id']}/checkpoints/{final['id']}/download"

    first = await api.get(url, headers=auth(key))
    second = await api.get(url, headers=auth(key))

    assert first.status_code == 200, first.text
    assert first.content == FakeRestClient(pytrio_fake).archive(final["path"])
    assert first.headers["x-checkpoint-sha256"] == hashlib.sha256(first.content).hexdigest()
    assert second.content == first.content
    assert len(pytrio_fake.calls_named("download_checkpoint")) == 1  # then kept
    assert fetched_path(settings.artifact_root, trained["id"], final["id"]).is_file()


async def test_a_checkpoint_pytrio_no_longer_lists_is_a_404(api, key, trained, pytrio_fake):
    listed = (await api.get(f"/v1/jobs/{trained['id']}/checkpoints", headers=auth(key))).json()
    state = next(c for c in listed["data"] if c["kind"] == "state")
    del pytrio_fake.checkpoints[state["path"]]

    response = await api.get(
        f"/v1/jobs/{trained['id']}/checkpoints/{state['id']}/download", headers=auth(key)
    )

    assert response.status_code == 404, response.text
    assert response.json()["error"]["code"] == "checkpoint_not_found"
