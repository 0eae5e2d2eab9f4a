"""The OpenAI-compatible routes with the official `openai` package as the client, against
real `opd api` and `opd worker` processes on a finished tiny job: a chat completion with
logprobs (the playground's own answer, its usage counted), a text scored with
`completions.create` (echo, logprobs, max_tokens 0: the playground's values), the models
listed, streaming,
a completion whose answer was lost resent (and billed once), another team's job a 404, and
a missing worker a timeout, all in OpenAI's shapes."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.e2e.conftest import ROOT, Service, deployment, tiny_spec
from tests.e2e.servers import Relay
from tests.e2e.test_playground import added, http_answer, usage_row
from tests.support import assert_close

MESSAGES = [{"role": "user", "content": "What is 2 + 3?"}]


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    home = tmp_path_factory.mktemp("openai")
    with deployment(home, f"sqlite:///{home / 'opd.db'}") as running:
        running.start_worker()
        yield running


@pytest.fixture(scope="module")
def finished(service: Service) -> dict[str, Any]:
    """A tiny job run to its end; it saved sampler weights after step 2."""
    job = service.submit(tiny_spec(steps=4, save_every=2) | {"name": "served"})
    done = service.wait(job["id"])
    assert done["status"] == "succeeded", done
    return done


def client_of(service: Service, key: str | None = None) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{service.url}/v1", api_key=key or service.key, max_retries=0, timeout=120
    )


def sampled_tokens(service: Service, job_id: int) -> int:
    with service.client() as client:
        return client.jobs.get(job_id).usage.sampled_tokens


def greedy_playground_answer(service: Service, job_id: int) -> dict[str, Any]:
    response = httpx.post(
        f"{service.url}/v1/jobs/{job_id}/playground",
        json={"messages": MESSAGES, "max_tokens": 12, "temperature": 0},
        headers={"Authorization": f"Bearer {service.key}"},
        timeout=120,
    )
    assert response.status_code == 200, response.text
    return response.json()["outputs"][0]["completions"][0]


def test_a_chat_completion_with_logprobs_is_the_playgrounds_answer_and_counts_as_usage(
    service, finished
):
    model = f"job-{finished['id']}"
    before = sampled_tokens(service, finished["id"])
    completion = client_of(service).chat.completions.create(
        model=model,
        messages=MESSAGES,
        max_tokens=12,
        temperature=0,
        n=2,
        logprobs=True,
        top_logprobs=0,
    )
    after = sampled_tokens(service, finished["id"])
    expected = greedy_playground_answer(service, finished["id"])

    assert completion.object == "chat.completion" and completion.model == model
    assert [choice.index for choice in completion.choices] == [0, 1]
    for choice in completion.choices:  # greedy: both are the playground's completion
        assert choice.message.role == "assistant"
        assert choice.message.content == expected["text"]
        assert choice.finish_reason in {"stop", "length"}
        tokens = choice.logprobs.content
        assert [t.token for t in tokens] == expected["tokens"]
        assert_close([t.logprob for t in tokens], expected["logprobs"], what="the logprobs")
        assert all(t.top_logprobs == [] for t in tokens)
    usage = completion.usage
    assert usage.completion_tokens == 2 * len(expected["tokens"])
    assert usage.prompt_tokens > 0
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert after - before == usage.completion_tokens


def test_the_openai_packages_completions_score_a_text_as_the_playground_does(service, finished):
    """`client.completions.create` with echo, logprobs and max_tokens 0 (an eval harness's
    loglikelihood request) on the playground's completion, as token ids: the checkpoint's
    values are its sampling logprobs, the teacher's the scores the playground compared."""
    job = finished["id"]
    response = httpx.post(
        f"{service.url}/v1/jobs/{job}/playground",
        json={"messages": MESSAGES, "max_tokens": 12, "temperature": 0, "compare": ["teacher"]},
        headers={"Authorization": f"Bearer {service.key}"},
        timeout=120,
    )
    assert response.status_code == 200, response.text
    answer = response.json()
    (completion,) = answer["outputs"][0]["completions"]
    prompt, ids = answer["prompt_token_ids"], answer["prompt_token_ids"] + completion["token_ids"]
    client = client_of(service)
    for model, expected in (
        (f"job-{job}", completion["logprobs"]),
        (f"job-{job}:teacher", completion["teacher_logprobs"]),
    ):
        before = usage_row(service, job)
        scored = client.completions.create(
            model=model, prompt=ids, echo=True, logprobs=1, max_tokens=0
        )
        (choice,) = scored.choices
        values = choice.logprobs.token_logprobs
        assert scored.object == "text_completion" and scored.model == model
        assert len(values) == len(choice.logprobs.tokens) == len(ids)
        assert values[0] is None and None not in values[1:]
        assert_close(values[len(prompt) :], expected, rtol=1e-4, what=f"{model}'s logprobs")
        assert choice.text.startswith(answer["prompt"])
        assert (scored.usage.prompt_tokens, scored.usage.completion_tokens) == (len(ids), 0)
        column = "teacher_tokens" if model.endswith(":teacher") else "sampled_tokens"
        assert added(usage_row(service, job), before) == {
            "sampled_tokens": 0,
            "teacher_tokens": 0,
        } | {column: len(ids)}

    text = client.completions.create(
        model=f"job-{job}", prompt="What is 2 + 3?", echo=True, logprobs=1, max_tokens=4
    )
    assert text.choices[0].text.startswith("What is 2 + 3?")
    assert text.choices[0].logprobs.token_logprobs[0] is None
    assert len(text.choices[0].logprobs.tokens) == text.usage.total_tokens


def test_the_openai_packages_completions_score_a_list_of_prompts_with_top_logprobs(
    service, finished
):
    """`completions.create` over a list prompt, as an eval harness batches its
    loglikelihood requests (echo, logprobs 2, max_tokens 1 as lm_eval sends it): one
    choice per prompt in order, each the values its prompt alone gets, the usage summed;
    each position's top_logprobs the 2 likeliest tokens and the chosen one, whose value is
    the largest exactly where it is the likeliest."""
    model, client = f"job-{finished['id']}", client_of(service)
    texts = ["What is 2 + 3?", "Compute 7 * 8.", "abc"]
    batch = client.completions.create(
        model=model, prompt=texts, echo=True, logprobs=2, max_tokens=1, temperature=0
    )
    assert [choice.index for choice in batch.choices] == [0, 1, 2]
    prompt_tokens = 0
    for text, choice in zip(texts, batch.choices, strict=True):
        alone = client.completions.create(
            model=model, prompt=text, echo=True, logprobs=2, max_tokens=1, temperature=0
        )
        (expected,) = alone.choices
        assert choice.text == expected.text and choice.text.startswith(text)
        logprobs = choice.logprobs
        assert logprobs.tokens == expected.logprobs.tokens
        assert_close(logprobs.token_logprobs[1:], expected.logprobs.token_logprobs[1:], what=text)
        for token, value, top in zip(
            logprobs.tokens[1:], logprobs.token_logprobs[1:], logprobs.top_logprobs[1:], strict=True
        ):
            assert top[token] == value and 1 <= len(top) <= 3
            assert sorted(top.values(), reverse=True)[0] >= value
        assert logprobs.top_logprobs[-1] is not None, "the sampled token's alternatives too"
        prompt_tokens += alone.usage.prompt_tokens
    assert batch.usage.prompt_tokens == prompt_tokens
    assert batch.usage.completion_tokens == len(texts)
    greedy = [
        max(top.values()) == value
        for top, value in zip(
            batch.choices[0].logprobs.top_logprobs[1:],
            batch.choices[0].logprobs.token_logprobs[1:],
            strict=True,
        )
    ]
    assert greedy[-1], "a greedy sample is its position's likeliest token"

    ids = [[5, 6, 7], [8, 9]]
    scored = client.completions.create(model=model, prompt=ids, echo=True, logprobs=0, max_tokens=0)
    assert [len(choice.logprobs.tokens) for choice in scored.choices] == [3, 2]
    assert scored.usage.prompt_tokens == 5


def test_the_team_sees_the_jobs_models_and_each_can_be_sampled(service, finished):
    client = client_of(service)
    job = finished["id"]
    page = client.models.list()
    listed = [model.id for model in page]
    assert listed == [f"job-{job}", f"job-{job}:teacher", f"job-{job}:base"] + [
        f"job-{job}@step-{step}" for step in (2, 4)
    ]
    assert (page.object, page.has_more, page.first_id, page.last_id) == (
        "list",
        False,
        listed[0],
        listed[-1],
    )
    first = client.models.list(extra_query={"limit": 3})
    rest = client.models.list(extra_query={"after": first.last_id})
    assert first.has_more and [m.id for m in first.data + rest.data] == listed, "paged"
    assert client.models.retrieve(f"job-{job}@step-2").owned_by == "e2e"
    for model in (f"job-{job}@step-2", f"job-{job}:teacher", f"job-{job}:base"):
        answer = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=4)
        assert answer.model == model and answer.usage.completion_tokens > 0, answer


def test_the_example_eval_loop_runs_over_a_jobs_models(service, finished):
    models = [f"job-{finished['id']}", f"job-{finished['id']}:teacher"]
    options = ["--base-url", f"{service.url}/v1", "--max-tokens", "8"]
    ran = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "openai_eval.py"), *models, *options],
        env=service.env | {"OPD_API_KEY": service.key},
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert ran.returncode == 0, ran.stderr
    lines = ran.stdout.splitlines()
    assert [line.split()[0] for line in lines] == [models[0]] * 4 + [models[1]] * 4
    assert all(
        re.search(r"'What is 2 \+ 3\?' +\d+ tokens, mean logprob +-?\d", line)
        for line in lines[::4]
    )


def test_stream_true_streams_the_completion_as_chunks(service, finished):
    stream = client_of(service).chat.completions.create(
        model=f"job-{finished['id']}",
        messages=MESSAGES,
        max_tokens=12,
        temperature=0,
        logprobs=True,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    expected = greedy_playground_answer(service, finished["id"])

    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == expected["text"]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [t.token for t in chunks[0].choices[0].logprobs.content] == expected["tokens"]
    assert chunks[-2].choices[0].finish_reason in {"stop", "length"}
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(
        expected["tokens"]
    )
    assert len({chunk.id for chunk in chunks}) == 1


def test_a_completion_whose_answer_was_lost_is_resent_and_billed_once(service, finished):
    """The `openai` package's retry after a read timeout, with the Idempotency-Key it is
    given: a relay loses the first answer, and the API answers the resent request with the
    completion it kept (sampled once, billed once)."""
    relay = Relay(int(service.url.rsplit(":", 1)[1]), withhold_first=True)
    relay.start()
    before = usage_row(service, finished["id"])
    client = openai.OpenAI(
        base_url=f"{relay.url}/v1", api_key=service.key, max_retries=1, timeout=5
    )
    try:
        completion = client.chat.completions.create(
            model=f"job-{finished['id']}",
            messages=MESSAGES,
            max_tokens=8,
            extra_headers={"Idempotency-Key": "eval-run-1"},
        )
    finally:
        relay.stop()

    assert len(relay.answers) == 2
    (lost_headers, lost), (resent_headers, resent) = map(http_answer, relay.answers)
    assert json.loads(lost)["id"] == completion.id and resent == lost
    assert resent_headers.get("idempotent-replayed") == "true"
    assert "idempotent-replayed" not in lost_headers
    billed = {"sampled_tokens": completion.usage.completion_tokens, "teacher_tokens": 0}
    assert added(usage_row(service, finished["id"]), before) == billed


def test_another_teams_job_is_a_404_in_openais_shape(service, finished):
    other = service.opd("keys", "create", "--team", "other").stdout.strip()
    with pytest.raises(openai.NotFoundError) as raised:
        client_of(service, other).chat.completions.create(
            model=f"job-{finished['id']}", messages=MESSAGES, max_tokens=4
        )
    error = raised.value
    assert error.code == "model_not_found" and error.param == "model"
    assert error.type == "invalid_request_error"
    assert f"job-{finished['id']}` does not exist or you do not have access" in error.message
    assert [model.id for model in client_of(service, other).models.list()] == []


def test_without_a_worker_a_completion_times_out_in_openais_shape(service, finished):
    for worker in [p for p in service.processes if "worker" in str(p.args)]:
        worker.kill()
        worker.wait(30)
    with pytest.raises(openai.InternalServerError) as raised:
        client_of(service).chat.completions.create(
            model=f"job-{finished['id']}",
            messages=MESSAGES,
            max_tokens=4,
            extra_body={"timeout_seconds": 1},
        )
    error = raised.value
    assert error.status_code == 504 and error.code == "worker_timeout"
    assert error.type == "server_error" and "no worker answered within 1 s" in error.message
