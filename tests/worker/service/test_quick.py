"""The quick tasks through the API and a quick arq worker (in process, on the real Redis),
for a job trained on the PyTRIO fake: the playground samples the saved weights PyTRIO
holds, every door that samples bills exactly what the backend sampled (once, however often
a request is resent with its Idempotency-Key), and a checkpoint's archive is fetched once
through PyTRIO's REST client."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from app.jobs.archives import fetched_path
from tests.app.conftest import auth
from tests.app.web.conftest import post_form
from tests.fakes import model
from tests.fakes.faults import fail_first, hold_first
from tests.fakes.trio import (
    Call,
    FakeSamplingClient,
    FakeServiceClient,
    base_weights,
    patch_pytrio,
)
from tests.fakes.trio_rest import FakeRestClient
from tests.support import assert_close

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
def job_spec() -> dict[str, Any]:
    """The spec `trained` (conftest.py) runs."""
    return SPEC


async def test_the_playground_samples_the_weights_pytrio_saved(api, key, trained, pytrio_fake):
    body = {"prompt": "What is 1 + 1?", "compare": ["teacher"], "n": 2, "max_tokens": 5}
    url = f"/v1/jobs/{trained['id']}/playground"
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


async def test_a_workers_failure_to_fetch_names_no_worker_folder_to_a_team(
    api, key, make_key, trained, pytrio_fake, settings
):
    """The worker cannot write where it keeps archives: its error, relayed, reads from the
    job's folder on for the team's key, and whole for an admin key."""
    listed = (await api.get(f"/v1/jobs/{trained['id']}/checkpoints", headers=auth(key))).json()
    final = next(c for c in listed["data"] if c["kind"] == "final")
    blocked = fetched_path(settings.artifact_root, trained["id"], final["id"]).parent
    blocked.parent.mkdir(parents=True, exist_ok=True)
    blocked.write_text("a file where the worker's downloads folder goes")
    url = f"/v1/jobs/{trained['id']}/checkpoints/{final['id']}/download"

    team = await api.get(url, headers=auth(key))
    admin = await api.get(url, headers=auth(await make_key(admin=True)))

    assert team.status_code == admin.status_code == 502, team.text
    told = team.json()["error"]["message"]
    assert f"job-{trained['id']}/downloads" in told and str(settings.artifact_root) not in told
    assert str(blocked) in admin.json()["error"]["message"]


# --- every sampled token billed once ------------------------------------------------------------

BODY = {"prompt": "What is 1 + 1?", "n": 2, "max_tokens": 5}
MESSAGES = [{"role": "user", "content": "What is 1 + 1?"}]


def backend_tokens(calls: list[Call]) -> dict[str, int]:
    """The tokens PyTRIO's fake sampled and scored in `calls`, as the usage counters name
    them: the student's completions; the teacher's prompt and completions, and each
    sequence it scored."""
    counts = {"sampled_tokens": 0, "teacher_tokens": 0}
    for call in calls:
        if call.name == "sample" and call.args["weights"] == base_weights("teacher/model"):
            response = call.args["response"]
            counts["teacher_tokens"] += response.input_tokens + response.output_tokens
        elif call.name == "sample":
            counts["sampled_tokens"] += call.args["response"].output_tokens
        elif call.name == "compute_logprobs":
            chunks = call.args["request"].prompt.chunks
            counts["teacher_tokens"] += sum(len(chunk.tokens) for chunk in chunks)
    return counts


async def usage_of(api, key, job_id: int) -> dict[str, int]:
    """The job's sampled and teacher tokens as `GET /v1/usage` adds up its rows."""
    report = (await api.get("/v1/usage", headers=auth(key))).json()
    (row,) = [row for row in report["rows"] if row["job_id"] == job_id]
    return {column: row[column] for column in ("sampled_tokens", "teacher_tokens")}


@dataclass
class Bill:
    before: dict[str, int]
    first_call: int
    added: dict[str, int] = field(default_factory=dict)
    done: dict[str, int] = field(default_factory=dict)

    def samplings(self, pytrio_fake: FakeServiceClient) -> list[str]:
        """The backend's sampling and scoring calls since the bill began."""
        calls = pytrio_fake.calls[self.first_call :]
        return [call.name for call in calls if call.name in ("sample", "compute_logprobs")]


@asynccontextmanager
async def billed(api, key, job_id: int, pytrio_fake: FakeServiceClient) -> AsyncIterator[Bill]:
    """What the block added to the job's usage rows, beside what the backend did meanwhile."""
    bill = Bill(before=await usage_of(api, key, job_id), first_call=len(pytrio_fake.calls))
    yield bill
    after = await usage_of(api, key, job_id)
    bill.added = {column: after[column] - bill.before[column] for column in after}
    bill.done = backend_tokens(pytrio_fake.calls[bill.first_call :])


async def test_every_door_bills_the_tokens_its_backend_sampled(api, key, trained, pytrio_fake):
    """The playground, the OpenAI-compatible route (the checkpoint and the teacher) and the
    dashboard's Try it, each against the job's usage rows."""
    job_id = trained["id"]
    async with billed(api, key, job_id, pytrio_fake) as playground:
        body = BODY | {"compare": ["teacher", "base"]}
        answered = await api.post(f"/v1/jobs/{job_id}/playground", json=body, headers=auth(key))
    chats = []
    for name in (f"job-{job_id}", f"job-{job_id}:teacher"):
        async with billed(api, key, job_id, pytrio_fake) as chat:
            body = {"model": name, "messages": MESSAGES, "n": 2, "max_tokens": 5}
            answer = await api.post("/v1/chat/completions", json=body, headers=auth(key))
            assert answer.status_code == 200, answer.text
        chats.append(chat)
    page = await api.get("/ui/sign-in")
    await post_form(api, "/ui/sign-in", page, key=key.key)
    page = await api.get(f"/ui/jobs/{job_id}")
    async with billed(api, key, job_id, pytrio_fake) as try_it:
        form = {"prompt": "What is 1 + 1?", "max_tokens": "5", "compare_teacher": "1"}
        tried = await post_form(api, f"/ui/jobs/{job_id}/try", page, **form)

    assert answered.status_code == 200 and tried.status_code == 200, tried.text
    for bill in (playground, try_it):
        assert bill.added == bill.done and min(bill.done.values()) > 0, bill
    student, teacher = chats
    assert student.added == student.done and student.done["sampled_tokens"] > 0, student
    assert teacher.added == teacher.done and teacher.done["teacher_tokens"] > 0, teacher


async def test_a_sample_resent_while_the_first_waits_is_sampled_and_billed_once(
    api, key, trained, pytrio_fake, monkeypatch
):
    """A read timeout's retry: the same Idempotency-Key and body arrive while the backend
    is still sampling the first; the repeat joins it, and a later one gets its answer."""
    url, waits = f"/v1/jobs/{trained['id']}/playground", app_of(api).state.waits
    headers = auth(key) | {"Idempotency-Key": "retried-1"}
    slow = hold_first(monkeypatch, FakeSamplingClient, "sample_async")
    async with billed(api, key, trained["id"], pytrio_fake) as bill:
        first = asyncio.create_task(api.post(url, json=BODY, headers=headers))
        await slow.entered.wait()
        second = asyncio.create_task(api.post(url, json=BODY, headers=headers))
        while waits.places.held[key.team.id] < 2:  # the repeat waits for the first's answer
            await asyncio.sleep(0.01)
        slow.release.set()
        answers = [await first, await second]
        third = await api.post(url, json=BODY, headers=headers)
    other = await api.post(url, json=BODY | {"n": 1}, headers=headers)

    assert [answer.status_code for answer in (*answers, third)] == [200, 200, 200]
    assert answers[0].json() == answers[1].json() == third.json()
    replayed = [answer.headers.get("idempotent-replayed") for answer in (*answers, third)]
    assert sorted(replayed, key=str) == [None, "true", "true"]
    assert bill.samplings(pytrio_fake) == ["sample"]
    assert bill.added == bill.done and bill.done["sampled_tokens"] > 0, bill
    assert other.status_code == 422, other.text
    error = other.json()["error"]
    assert error["code"] == "idempotency_key_reused" and error["param"] == "Idempotency-Key"


async def test_a_chat_completion_resent_gets_the_first_and_is_billed_once(
    api, key, trained, pytrio_fake
):
    body = {"model": f"job-{trained['id']}", "messages": MESSAGES, "n": 2, "max_tokens": 5}
    headers = auth(key) | {"Idempotency-Key": "chat-1"}
    async with billed(api, key, trained["id"], pytrio_fake) as bill:
        first = await api.post("/v1/chat/completions", json=body, headers=headers)
        again = await api.post("/v1/chat/completions", json=body, headers=headers)
    other = await api.post("/v1/chat/completions", json=body | {"n": 1}, headers=headers)

    assert first.status_code == again.status_code == 200, again.text
    assert again.json() == first.json() and again.headers["idempotent-replayed"] == "true"
    assert bill.samplings(pytrio_fake) == ["sample"]
    assert bill.added == bill.done and bill.done["sampled_tokens"] > 0, bill
    assert other.status_code == 400, other.text
    assert other.json()["error"]["param"] == "Idempotency-Key"


async def test_a_sample_that_failed_is_tried_anew_when_resent(
    api, key, trained, pytrio_fake, monkeypatch
):
    """Nothing was kept for a failed request: its repeat samples (once), and is billed."""
    fail_first(monkeypatch, FakeSamplingClient, "sample_async", RuntimeError("backend hiccup"))
    url, headers = (
        f"/v1/jobs/{trained['id']}/playground",
        auth(key) | {"Idempotency-Key": "failed-1"},
    )
    async with billed(api, key, trained["id"], pytrio_fake) as bill:
        failed = await api.post(url, json=BODY, headers=headers)
        again = await api.post(url, json=BODY, headers=headers)

    assert failed.status_code == 502 and "backend hiccup" in failed.json()["error"]["message"]
    assert again.status_code == 200 and "idempotent-replayed" not in again.headers
    assert bill.samplings(pytrio_fake) == ["sample"]
    assert bill.added == bill.done and bill.done["sampled_tokens"] > 0, bill


async def test_a_sampling_failure_names_no_worker_folder(
    api, key, trained, pytrio_fake, monkeypatch, settings
):
    """A backend's error that quotes a worker folder reaches the door from the job's folder
    on (the team's view, for every key, as the answers are)."""
    folder = settings.artifact_root / f"job-{trained['id']}" / "weights" / "final"
    fail_first(monkeypatch, FakeSamplingClient, "sample_async", OSError(f"cannot read {folder}"))
    response = await api.post(f"/v1/jobs/{trained['id']}/playground", json=BODY, headers=auth(key))

    assert response.status_code == 502, response.text
    told = response.json()["error"]["message"]
    assert f"cannot read job-{trained['id']}/weights/final" in told, told
    assert str(settings.artifact_root) not in told


def app_of(http: httpx.AsyncClient) -> Any:
    """The app an in-process client is served by."""
    transport = http._transport
    assert isinstance(transport, httpx.ASGITransport)
    return transport.app


# --- POST /v1/completions: a text scored as the playground scores it ----------------------------


def top_logprobs(
    weights: str, ids: list[int], k: int, values: list[float | None]
) -> list[dict[str, float] | None]:
    """OpenAI's top_logprobs of `ids` scored as `values`: at each position the k
    likeliest tokens, then the token itself at its value."""
    return [None] + [
        {model.TOKENIZER.decode([t]): v for t, v in top or []}
        | {model.TOKENIZER.decode([token]): value}
        for top, token, value in zip(
            model.likeliest(weights, ids, k)[1:], ids[1:], values[1:], strict=True
        )
    ]


async def completed(api, key, **body: Any) -> dict[str, Any]:
    response = await api.post("/v1/completions", json=body, headers=auth(key))
    assert response.status_code == 200, response.text
    return response.json()


async def test_an_echoed_text_is_scored_as_the_playground_scored_it(api, key, trained, pytrio_fake):
    """The playground's completions (with the teacher's scores), then each as token ids
    (its prompt's and its own) echoed with max_tokens 0 by the checkpoint and by the
    teacher: a logprob per token, null first, the completion's the playground's ones, and
    the usage the scoring prefill's."""
    job_id = trained["id"]
    body = BODY | {"compare": ["teacher"]}
    answer = (await api.post(f"/v1/jobs/{job_id}/playground", json=body, headers=auth(key))).json()
    prompt = answer["prompt_token_ids"]
    assert prompt == model.TOKENIZER.encode(answer["prompt"], add_special_tokens=False)
    student, teacher = (
        pytrio_fake.checkpoints[trained["final_weights_path"]].weights,
        model.digest("base", "teacher/model"),
    )
    for completion in answer["outputs"][0]["completions"]:
        ids = prompt + completion["token_ids"]
        for name, weights, playground in (
            (f"job-{job_id}", student, completion["logprobs"]),
            (f"job-{job_id}:teacher", teacher, completion["teacher_logprobs"]),
        ):
            async with billed(api, key, job_id, pytrio_fake) as bill:
                scored = await completed(
                    api, key, model=name, prompt=ids, echo=True, logprobs=1, max_tokens=0
                )
            (choice,) = scored["choices"]
            logprobs = choice["logprobs"]
            assert scored["object"] == "text_completion" and scored["model"] == name
            assert choice["text"] == model.TOKENIZER.decode(ids)
            assert choice["finish_reason"] == "length" and choice["prompt_logprobs"] is None
            assert logprobs["tokens"] == [model.TOKENIZER.decode([token]) for token in ids]
            values = logprobs["token_logprobs"]
            assert len(values) == len(ids) and values[0] is None and None not in values[1:]
            assert_close(values[len(prompt) :], playground, what=f"{name}'s completion")
            assert_close(values[1:], model.score(weights, ids)[1:], what=f"{name}'s text")
            assert logprobs["top_logprobs"] == top_logprobs(weights, ids, 1, values)
            offsets = [0]
            for token in logprobs["tokens"][:-1]:
                offsets.append(offsets[-1] + len(token))
            assert logprobs["text_offset"] == offsets
            usage = {"prompt_tokens": len(ids), "completion_tokens": 0, "total_tokens": len(ids)}
            assert scored["usage"] == usage
            assert bill.samplings(pytrio_fake) == ["sample"], "one prefill ranks and scores"
            column = "teacher_tokens" if name.endswith(":teacher") else "sampled_tokens"
            assert bill.added == {"sampled_tokens": 0, "teacher_tokens": 0} | {column: len(ids)}


async def test_a_text_prompt_is_completed_after_its_own_tokens_and_echoed(
    api, key, trained, pytrio_fake
):
    """A text prompt, read as given (no template), sampled n times with echo and logprobs:
    each choice's text and logprobs start with the prompt's, then the sampled tokens with
    their sampling logprobs; vLLM's prompt_logprobs give the same prompt values."""
    text = "What is 1 + 1?"
    prompt = model.TOKENIZER.encode(text, add_special_tokens=True)
    student = pytrio_fake.checkpoints[trained["final_weights_path"]].weights
    async with billed(api, key, trained["id"], pytrio_fake) as bill:
        answer = await completed(
            api,
            key,
            model=f"job-{trained['id']}",
            prompt=[text],
            echo=True,
            logprobs=5,
            prompt_logprobs=2,
            max_tokens=5,
            n=2,
            seed=7,
        )

    sampling, *rankings = [c for c in pytrio_fake.calls[bill.first_call :] if c.name == "sample"]
    sequences = sampling.args["response"].sequences
    assert [choice["index"] for choice in answer["choices"]] == [0, 1]
    assert [call.args["request"].topk_prompt_logprobs for call in rankings] == [5] * 3
    sampled = ranked = 0
    for choice, sequence in zip(answer["choices"], sequences, strict=True):
        logprobs = choice["logprobs"]
        ids = prompt + list(sequence.tokens)
        assert logprobs["tokens"] == [model.TOKENIZER.decode([token]) for token in ids]
        assert choice["text"] == text + model.TOKENIZER.decode(
            sequence.tokens, skip_special_tokens=True
        )
        values = logprobs["token_logprobs"]
        assert values[0] is None
        assert_close(values[1:], model.score(student, ids)[1:], what="the prompt and completion")
        assert logprobs["top_logprobs"] == top_logprobs(student, ids, 5, values)
        assert choice["prompt_logprobs"] == [None] + [
            {str(token): {"logprob": value, "rank": ranks.get(token), "decoded_token": piece}}
            | {
                str(t): {"logprob": v, "rank": rank, "decoded_token": model.TOKENIZER.decode([t])}
                for rank, (t, v) in enumerate(top or [], start=1)
                if t != token
            }
            for token, value, piece, top in zip(
                prompt[1:],
                values[1 : len(prompt)],
                logprobs["tokens"][1 : len(prompt)],
                model.likeliest(student, prompt, 2)[1:],
                strict=True,
            )
            for ranks in [{t: rank for rank, (t, _) in enumerate(top or [], start=1)}]
        ]
        sampled += len(ids) - len(prompt)
        ranked += len(ids)
    usage = answer["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (len(prompt), sampled)
    assert bill.samplings(pytrio_fake) == ["sample"] * 4, (
        "sampled, the prompt ranked, each completion"
    )
    assert bill.added == {"sampled_tokens": sampled + len(prompt) + ranked, "teacher_tokens": 0}

    plain = await completed(api, key, model=f"job-{trained['id']}", prompt=text, max_tokens=3)
    (choice,) = plain["choices"]
    assert choice["logprobs"] is None and not choice["text"].startswith(text)
    assert plain["usage"]["prompt_tokens"] == len(prompt)


async def test_a_list_of_prompts_is_one_choice_each_in_order_its_usage_summed(
    api, key, trained, pytrio_fake
):
    """Texts sampled n times each: prompt after prompt, each choice echoing its own
    prompt; then token-id lists scored (max_tokens 0) each as its text alone scores; the
    usage and the bill the sum of the prompts'."""
    job = f"job-{trained['id']}"
    texts = ["What is 1 + 1?", "2 + 2 =", "Say hi"]
    async with billed(api, key, trained["id"], pytrio_fake) as bill:
        answer = await completed(
            api, key, model=job, prompt=texts, n=2, max_tokens=3, echo=True, logprobs=0
        )
    choices = answer["choices"]
    assert [choice["index"] for choice in choices] == list(range(6))
    for place, choice in enumerate(choices):
        assert choice["text"].startswith(texts[place // 2])
    prompts = [len(model.TOKENIZER.encode(text, add_special_tokens=True)) for text in texts]
    sampled = sum(len(c["logprobs"]["tokens"]) for c in choices) - 2 * sum(prompts)
    usage = answer["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (sum(prompts), sampled)
    assert bill.samplings(pytrio_fake).count("sample") == 3
    assert bill.added == {"sampled_tokens": sampled + sum(prompts), "teacher_tokens": 0}

    student = pytrio_fake.checkpoints[trained["final_weights_path"]].weights
    ids = [model.TOKENIZER.encode(text, add_special_tokens=True) for text in texts]
    scored = await completed(api, key, model=job, prompt=ids, echo=True, logprobs=1, max_tokens=0)
    assert [choice["index"] for choice in scored["choices"]] == [0, 1, 2]
    for choice, one in zip(scored["choices"], ids, strict=True):
        alone = await completed(
            api, key, model=job, prompt=one, echo=True, logprobs=1, max_tokens=0
        )
        assert choice["logprobs"] == alone["choices"][0]["logprobs"]
        assert_close(choice["logprobs"]["token_logprobs"][1:], model.score(student, one)[1:])
    assert scored["usage"]["prompt_tokens"] == sum(len(one) for one in ids)


async def test_a_bad_prompt_in_a_list_is_a_400_naming_its_place(api, key, trained):
    body = {"model": f"job-{trained['id']}", "prompt": [[1, 2], [1, model.VOCAB + 3]]}
    response = await api.post("/v1/completions", json=body, headers=auth(key))

    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["type"], error["code"]) == ("invalid_request_error", "invalid_prompt")
    assert error["message"].startswith(f"prompt 1: prompt_token_ids: {model.VOCAB + 3} is not")


async def test_a_completion_resent_gets_the_first_and_is_billed_once(
    api, key, trained, pytrio_fake
):
    body = {
        "model": f"job-{trained['id']}",
        "prompt": ["1 + 1 =", "2"],
        "echo": True,
        "logprobs": 0,
    }
    headers = auth(key) | {"Idempotency-Key": "completion-1"}
    async with billed(api, key, trained["id"], pytrio_fake) as bill:
        first = await api.post("/v1/completions", json=body, headers=headers)
        again = await api.post("/v1/completions", json=body, headers=headers)

    assert first.status_code == again.status_code == 200, again.text
    assert again.json() == first.json() and again.headers["idempotent-replayed"] == "true"
    assert sorted(bill.samplings(pytrio_fake)) == ["compute_logprobs"] * 2 + ["sample"] * 2
    usage = first.json()["usage"]
    assert bill.added == {"sampled_tokens": usage["total_tokens"], "teacher_tokens": 0}


async def test_a_token_id_beyond_the_vocabulary_is_a_400_in_openais_shape(api, key, trained):
    body = {"model": f"job-{trained['id']}", "prompt": [1, model.VOCAB + 3], "max_tokens": 1}
    response = await api.post("/v1/completions", json=body, headers=auth(key))

    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["type"], error["code"]) == ("invalid_request_error", "invalid_prompt")
    assert f"{model.VOCAB + 3} is not a token id" in error["message"]
