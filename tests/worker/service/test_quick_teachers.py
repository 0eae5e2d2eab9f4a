"""The playground's doors (the API, the OpenAI-compatible routes, the dashboard's Try it)
for a job trained on the PyTRIO fake whose teachers have their own chat template or another
tokenizer: each model reads the prompt as its own tokenizer renders it, the teacher scores
the student's completion after its own rendering (or in its own tokens, mapped back), and
the job is billed the tokens each model read."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.app.conftest import auth
from tests.app.web.conftest import post_form
from tests.fakes import model
from tests.fakes.trio import FakeServiceClient, base_weights, patch_pytrio
from tests.support import assert_close
from worker.engine.backends.local.presets import SYSTEM_CHAT_TEMPLATE, tiny_tokenizer

OWN, CROSS = "teacher/own", "teacher/cross"
OWN_TOKENIZER = tiny_tokenizer(SYSTEM_CHAT_TEMPLATE)
MESSAGES = [{"role": "user", "content": "What is 1 + 1?"}]


def cross_tokenizer() -> Any:
    """Another vocabulary (one token more), so a teacher over it is cross-tokenizer."""
    tokenizer = tiny_tokenizer(SYSTEM_CHAT_TEMPLATE)
    tokenizer.add_tokens(["<extra>"])
    return tokenizer


CROSS_TOKENIZER = cross_tokenizer()
SPEC = {
    "name": "teachers-job",
    "backend": "trio",
    "student": {"base_model": "student/model", "lora_rank": 8},
    "teachers": {"own": {"base_model": OWN}, "cross": {"base_model": CROSS}},
    "datasets": [
        {"name": name, "source": "inline", "prompts": ["What is 1 + 1?"], "teacher": name}
        for name in ("own", "cross")
    ],
    "sampling": {"max_tokens": 6},
    "loop": {"steps": 1, "batch_size": 2, "group_size": 2},
    "trio": {"call_attempts": 1},
}


@pytest.fixture
async def pytrio_fake(monkeypatch) -> FakeServiceClient:
    fake = FakeServiceClient(tokenizers={OWN: OWN_TOKENIZER, CROSS: CROSS_TOKENIZER})
    patch_pytrio(monkeypatch, fake)
    return fake


@pytest.fixture
def job_spec() -> dict[str, Any]:
    return SPEC


def chat_ids(tokenizer: Any) -> list[int]:
    text = tokenizer.apply_chat_template(
        MESSAGES, tokenize=False, add_generation_prompt=True, enable_thinking=False
    )
    return list(tokenizer.encode(text, add_special_tokens=False))


async def usage_of(api: httpx.AsyncClient, key: Any, job_id: int) -> dict[str, int]:
    report = (await api.get("/v1/usage", headers=auth(key))).json()
    (row,) = [row for row in report["rows"] if row["job_id"] == job_id]
    return {column: row[column] for column in ("sampled_tokens", "teacher_tokens")}


async def test_a_teacher_with_its_own_template_reads_its_own_chat_and_is_billed_so(
    api, key, trained, pytrio_fake
):
    job_id = trained["id"]
    before = await usage_of(api, key, job_id)
    body = {"messages": MESSAGES, "n": 2, "max_tokens": 5, "compare": ["teacher"]}
    response = await api.post(f"/v1/jobs/{job_id}/sample", json=body, headers=auth(key))
    after = await usage_of(api, key, job_id)

    assert response.status_code == 200, response.text
    answer = response.json()
    checkpoint, teacher = answer["outputs"]
    student_prompt, teacher_prompt = chat_ids(model.TOKENIZER), chat_ids(OWN_TOKENIZER)
    assert student_prompt != teacher_prompt
    assert answer["prompt_token_ids"] == checkpoint["prompt_token_ids"] == student_prompt
    assert teacher["prompt_token_ids"] == teacher_prompt
    assert teacher["prompt"] == OWN_TOKENIZER.decode(teacher_prompt)
    own = base_weights(OWN)
    sampled = [c for c in pytrio_fake.calls_named("sample") if c.args["weights"] == own]
    assert [c.args["request"].prompt.chunks[0].tokens for c in sampled[-1:]] == [teacher_prompt]
    read = 0
    for completion in checkpoint["completions"]:
        tokens = completion["token_ids"]
        expected = model.score(own, teacher_prompt + tokens)[len(teacher_prompt) :]
        assert_close(completion["teacher_logprobs"], expected, what="after its own prompt")
        assert completion["teacher_tokens_read"] == len(teacher_prompt) + len(tokens)
        read += len(teacher_prompt) + len(tokens)
    written = sum(len(c["token_ids"]) for c in teacher["completions"])
    assert (
        after["teacher_tokens"] - before["teacher_tokens"] == read + len(teacher_prompt) + written
    )


async def test_a_teacher_with_another_tokenizer_is_compared_on_every_door(api, key, trained):
    job_id = trained["id"]
    body = {"messages": MESSAGES, "max_tokens": 5, "n": 4, "compare": ["teacher"]}
    body |= {"teacher": "cross", "seed": 1}
    response = await api.post(f"/v1/jobs/{job_id}/sample", json=body, headers=auth(key))
    ids = {"prompt_token_ids": chat_ids(model.TOKENIZER), "messages": None}
    refused = await api.post(f"/v1/jobs/{job_id}/sample", json=body | ids, headers=auth(key))
    page = await api.get("/ui/sign-in")
    await post_form(api, "/ui/sign-in", page, key=key.key)
    page = await api.get(f"/ui/jobs/{job_id}")
    form = {"prompt": "What is 1 + 1?", "max_tokens": "5", "compare_teacher": "1"}
    tried = await post_form(api, f"/ui/jobs/{job_id}/try", page, **form)

    assert response.status_code == 200, response.text
    checkpoint, teacher = response.json()["outputs"]
    assert teacher["prompt_token_ids"] == chat_ids(CROSS_TOKENIZER)
    written = [c for c in checkpoint["completions"] if c["text"]]  # not only an end
    assert written, checkpoint["completions"]
    for completion in checkpoint["completions"]:
        assert len(completion["teacher_logprobs"]) == len(completion["token_ids"])
    for completion in written:
        assert 0 < completion["aligned_bytes_fraction"] <= 1, completion
    assert refused.status_code == 422, refused.text
    assert refused.json()["error"]["code"] == "invalid_prompt"
    assert "has another tokenizer" in refused.json()["error"]["message"]
    assert tried.status_code == 200, tried.text  # the first teacher: its own template
    assert tried.text.count('class="rollout try-output"') == 2
    assert tried.text.count("prompt tokens</span>") == 2
