"""The server teacher's client against a real HTTP server speaking vLLM's completions shapes
(tests/fakes/vllm_server.py): it scores token-id prompts by echo + logprobs or by
prompt_logprobs, gathers concurrent calls into list-prompt requests, keeps to its
concurrency, retries 429 and 5xx with backoff, and says plainly what it cannot use."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from pytrio.types import ModelInput

from kernel.errors import OPDError
from kernel.spec import TeacherServer
from tests.fakes.vllm_server import ByteTokenizer, FakeVLLM, score, serving
from tests.support import assert_close
from tests.worker.engine.backends.test_conformance import follows
from worker.engine.backends.contract import SamplingClient
from worker.engine.backends.server import ServerTeacher
from worker.engine.rollouts.datums import completion_topk

PROMPTS = [[10 + i, 20 + i, 30 + i, 40 + i, 50 + i] for i in range(6)]


def expected(tokens: list[int]) -> list[float | None]:
    return [None, *(score(t, i) for i, t in enumerate(tokens) if i)]


@pytest.fixture
def fake() -> FakeVLLM:
    return FakeVLLM()


@pytest.fixture
def url(fake: FakeVLLM) -> Iterator[str]:
    with serving(fake) as base:
        yield base


KEY = "sk-test"


def teacher(
    url: str, warnings: list[str] | None = None, key: str | None = KEY, **options: Any
) -> ServerTeacher:
    settings = {"url": url, "model": "job-7", "retry_delay_seconds": 0.01} | options
    heard = warnings if warnings is not None else []
    return ServerTeacher(
        TeacherServer.model_validate(settings),
        ByteTokenizer(),
        warn=lambda message, data: heard.append(f"{message} {data}"),
        key=key,
    )


def no_answer_text(text: str) -> None:
    """Nothing of the server's answer (which echoes the key) is in `text`."""
    assert KEY not in text and "scripted" not in text and "echo:" not in text, text


async def scored_all(client: ServerTeacher, prompts: list[list[int]]) -> list[list[float | None]]:
    try:
        return await asyncio.gather(
            *(client.compute_logprobs_async(ModelInput.from_ints(p)) for p in prompts)
        )
    finally:
        await client.aclose()


def test_it_follows_the_sampling_client_contract():
    assert follows(ServerTeacher, SamplingClient) == []


@pytest.mark.parametrize("protocol", ["echo", "prompt_logprobs"])
async def test_concurrent_scores_share_requests_of_at_most_batch_size(fake, url, protocol):
    client = teacher(url, batch_size=4, protocol=protocol)
    scores = await scored_all(client, PROMPTS)

    for tokens, values in zip(PROMPTS, scores, strict=True):
        assert values[0] is None
        assert_close(values[1:], expected(tokens)[1:], what="the server's logprobs")
    assert [len(body["prompt"]) for body in fake.bodies] == [4, 2]
    assert [body["prompt"] for body in fake.bodies] == [PROMPTS[:4], PROMPTS[4:]]
    for body in fake.bodies:
        assert body["max_tokens"] == 0 and body["model"] == "job-7"
        if protocol == "echo":
            assert body["echo"] is True and body["logprobs"] >= 1
        else:
            assert body["prompt_logprobs"] == 0 and "logprobs" not in body
    assert {h["authorization"] for h in fake.headers} == {"Bearer sk-test"}


async def test_one_prompt_goes_as_token_ids_alone(fake, url):
    (values,) = await scored_all(teacher(url), PROMPTS[:1])
    assert fake.bodies[0]["prompt"] == PROMPTS[0]
    assert (fake.bodies[0]["max_tokens"], fake.bodies[0]["temperature"]) == (0, 1.0)
    assert_close(values[1:], expected(PROMPTS[0])[1:], what="the logprobs")


async def test_requests_in_flight_stay_within_max_concurrency(fake, url):
    await scored_all(teacher(url, batch_size=1, max_concurrency=2), PROMPTS)
    assert len(fake.bodies) == len(PROMPTS)
    assert fake.most_in_flight == 2


async def test_a_429_then_a_503_are_retried_and_the_scores_come_back(fake, url):
    fake.script = [429, 503]
    warnings: list[str] = []
    (values,) = await scored_all(teacher(url, warnings, max_retries=2), PROMPTS[:1])
    assert_close(values[1:], expected(PROMPTS[0])[1:], what="the logprobs")
    assert len(fake.bodies) == 3
    assert len(warnings) == 2 and "HTTP 429" in warnings[0] and "HTTP 503" in warnings[1]
    assert "try 2 of 3" in warnings[0]
    for warning in warnings:
        no_answer_text(warning)


async def test_5xx_after_every_retry_fails_with_what_to_do(fake, url):
    fake.script = [500, 502, 503]
    with pytest.raises(OPDError) as failed:
        await scored_all(teacher(url, max_retries=2), PROMPTS[:3])
    assert failed.value.code == "teacher_server_unavailable"
    message = str(failed.value)
    assert url in message and "3 tries" in message and "HTTP 503" in message
    assert "teacher.server.max_retries" in message
    no_answer_text(message)
    assert len(fake.bodies) == 3  # one request for the three prompts, tried three times


async def test_a_server_without_prompt_logprobs_is_told_at_once(fake, url):
    fake.script = ["no_logprobs"]
    with pytest.raises(OPDError) as failed:
        await scored_all(teacher(url, max_retries=3), PROMPTS[:1])
    assert failed.value.code == "teacher_server_protocol"
    assert "no prompt logprobs" in str(failed.value) and "echo" in str(failed.value)
    assert len(fake.bodies) == 1  # never retried


async def test_an_answer_slower_than_the_timeout_is_a_timeout(fake, url):
    fake.script = ["slow"]
    with pytest.raises(OPDError) as failed:
        await scored_all(teacher(url, timeout_seconds=0.3, max_retries=0), PROMPTS[:1])
    assert failed.value.code == "teacher_server_unavailable"
    assert "Timeout" in str(failed.value) and "1 try" in str(failed.value)


async def test_a_refused_key_is_its_status_and_our_code_never_the_answer(fake, url):
    fake.script = [401]
    with pytest.raises(OPDError) as refused:
        await scored_all(teacher(url), PROMPTS[:1])
    assert refused.value.code == "teacher_server_auth"
    message = str(refused.value)
    assert "HTTP 401" in message and "OPD_TEACHER_SERVERS" in message
    no_answer_text(message)
    assert fake.headers[0]["authorization"] == f"Bearer {KEY}"  # the bound key was sent
    assert len(fake.bodies) == 1


async def test_a_rejected_request_that_echoes_the_key_keeps_it_out_of_the_error(fake, url):
    fake.script = [400]
    with pytest.raises(OPDError) as rejected:
        await scored_all(teacher(url), PROMPTS[:1])
    assert rejected.value.code == "teacher_server_rejected"
    assert "HTTP 400" in str(rejected.value)
    no_answer_text(str(rejected.value))


async def test_without_a_bound_key_no_authorization_is_sent(fake, url):
    await scored_all(teacher(url, key=None), PROMPTS[:1])
    assert "authorization" not in fake.headers[0]


def test_a_spec_naming_a_key_variable_is_refused_with_the_new_way(url):
    from pydantic import ValidationError

    with pytest.raises(ValidationError) as refused:
        TeacherServer.model_validate({"url": url, "model": "m", "api_key_env": "AWS_SECRET"})
    (error,) = refused.value.errors()
    assert error["loc"] == ("api_key_env",) and "OPD_TEACHER_SERVERS" in error["msg"]


async def test_a_server_that_is_down_is_retried_then_unavailable():
    from opd.serve import free_port

    down = f"http://127.0.0.1:{free_port()}/v1"
    warnings: list[str] = []
    with pytest.raises(OPDError) as failed:
        await scored_all(teacher(down, warnings, max_retries=2), PROMPTS[:1])
    assert failed.value.code == "teacher_server_unavailable"
    assert "ConnectError" in str(failed.value) and len(warnings) == 2


async def test_top_k_prompt_logprobs_come_by_id_as_the_loop_reads_them(fake, url):
    client = teacher(url, protocol="prompt_logprobs")
    tokens, k = PROMPTS[0], 3
    try:
        response = await client.sample_async(
            ModelInput.from_ints(tokens), include_prompt_logprobs=True, topk_prompt_logprobs=k
        )
    finally:
        await client.aclose()
    assert fake.bodies[0]["prompt_logprobs"] == k
    assert_close(response.prompt_logprobs[1:], expected(tokens)[1:], what="the logprobs")
    topk = completion_topk(response.topk_prompt_logprobs, 2, len(tokens) - 2, k)
    for position, row in enumerate(topk, start=2):
        likeliest = sorted(range(256), key=lambda t: (-score(t, position), t))[:k]
        assert [t for t, _ in row] == likeliest
        assert_close([v for _, v in row], [score(t, position) for t in likeliest], what="top-k")


async def test_the_probe_finds_a_server_that_reads_ids_otherwise(url, fake):
    client = teacher(url)
    try:
        assert await client.probe(PROMPTS[0]) is None
        fake.offset = 1
        difference = await client.probe(PROMPTS[1])
    finally:
        await client.aclose()
    assert difference is not None and "token 0 (id 11)" in difference
