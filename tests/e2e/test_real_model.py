"""A real model through the service: smollm2-135m-instruct (the `smollm2` extra) as student
and teacher of a two-step job run by real `opd api` and `opd worker` processes, then served
by the playground and `/v1/completions`, and exported with `opd export --merge` into a folder
that plain transformers loads and that reproduces the playground's logprobs. Not a learning
test: the teacher is the student's own base, so the first step's reverse KL is float rounding
(Adam's first steps then move the student a little, as they would any). The GGUF is converted
once for the test run (the shared model cache the worker is pointed at)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from kernel.model_names import SMOLLM2
from opd.cli import main
from tests.e2e.conftest import Service, deployment
from tests.support import assert_close, converted_smollm2, score_without_peft

pytestmark = pytest.mark.timeout(900)  # a 135M model on a loaded 2-core machine

QUESTION = "7 + 8 = ?"
SPEC = {
    "name": "smollm2-e2e",
    "backend": "local",
    "student": {"base_model": SMOLLM2, "lora_rank": 4, "seed": 1},
    "teacher": {"base_model": SMOLLM2},
    "dataset": {"source": "inline", "question_suffix": "", "prompts": [QUESTION, "2 + 2 = ?"]},
    "sampling": {"max_tokens": 8},
    "loop": {"steps": 2, "batch_size": 2, "group_size": 2},
    "local": {"device": "cpu"},
    "swanlab": {"enabled": False},
}


@pytest.fixture(scope="module")
def model_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return converted_smollm2(tmp_path_factory)


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory, model_cache: Path) -> Iterator[Service]:
    home = tmp_path_factory.mktemp("real-model")
    with deployment(home, f"sqlite:///{home / 'opd.db'}", model_cache=str(model_cache)) as up:
        up.start_worker()
        yield up


@pytest.fixture(scope="module")
def trained(service: Service) -> dict[str, Any]:
    job = service.submit(SPEC)
    done = service.wait(job["id"], timeout=600)
    assert done["status"] == "succeeded", (done, service.logs())
    return done


def test_smollm2_trains_as_student_and_teacher_through_the_service(service, trained):
    kl = service.curve(trained["id"], "opd/reverse_kl_mean")
    tokens = service.curve(trained["id"], "data/completion_tokens_total")
    messages = [event.message for event in service.events(trained["id"])]

    assert [step for step, _ in kl] == [0, 1]
    assert abs(kl[0][1]) < 1e-4, "one model, read by the sampler and by the teacher"
    assert all(math.isfinite(value) for _, value in kl)
    assert all(0 < value <= 2 * 2 * 8 for _, value in tokens)
    assert f"Teacher {SMOLLM2!r}: same tokenizer, same chat template" in messages
    assert trained["final_weights_path"]


def test_the_playground_completions_and_the_merged_export_agree(
    service, trained, model_cache, tmp_path, monkeypatch, capsys
):
    """The playground's greedy answer and its logprobs; `/v1/completions` scores it the
    same; the merged export, loaded by transformers without peft, scores it the same."""
    job = trained["id"]
    response = httpx.post(
        f"{service.url}/v1/jobs/{job}/playground",
        json={"prompt": QUESTION, "max_tokens": 8, "temperature": 0},
        headers={"Authorization": f"Bearer {service.key}"},
        timeout=300,
    )
    assert response.status_code == 200, response.text
    answer = response.json()
    (checkpoint,) = answer["outputs"]
    (completion,) = checkpoint["completions"]
    prompt = answer["prompt_token_ids"]
    ids = prompt + completion["token_ids"]
    assert checkpoint["base_model"] == SMOLLM2 and checkpoint["weights"] is not None

    served = openai.OpenAI(base_url=f"{service.url}/v1", api_key=service.key, timeout=300)
    scored = served.completions.create(
        model=f"job-{job}", prompt=ids, echo=True, logprobs=1, max_tokens=0
    )
    values = scored.choices[0].logprobs.token_logprobs[len(prompt) :]
    assert_close(values, completion["logprobs"], rtol=1e-4, what="/v1/completions")

    monkeypatch.setenv("OPD_MODEL_CACHE", str(model_cache))  # as the worker's, for the base
    merged = tmp_path / "merged"
    code = main(
        ["export", str(job), str(merged), "--merge", "--url", service.url, "--key", service.key]
    )
    out, err = capsys.readouterr()
    assert code == 0 and "Its logprobs match the adapter model's" in out, err
    assert "Converting" not in err, "the base model came from the model cache"
    _, plain = score_without_peft(merged, ids=ids)
    assert_close(plain[len(prompt) - 1 :], completion["logprobs"], rtol=1e-4, what="the export")
