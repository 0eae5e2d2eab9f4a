"""The loop with a teacher on an inference server: a real HTTP server in vLLM's shapes
(tests/fakes/vllm_server.py) serving the PyTRIO fake's bigram teacher, the student on the
PyTRIO and Tinker fakes. The preflight names the mode and probes the server's tokens; the
advantages (and Tinker's top-k targets) are the server's scores of exactly the student's
tokens, gathered into batched requests; usage counts the tokens the server read."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kernel.errors import IncompatibleModels, OPDError
from kernel.model_names import ARITH_STUDENT
from kernel.spec import JobSpec, TeacherServer
from tests.fakes import model
from tests.fakes import tinker as tinker_fake
from tests.fakes.sinks import RecordingSink
from tests.fakes.trio import FakeServiceClient, base_weights
from tests.fakes.vllm_server import FakeVLLM, serving
from tests.support import assert_close
from tests.worker.engine.teachers.test_teacher_template import completions_of
from worker.engine.backends import connect
from worker.engine.backends.local.presets import bpe_tokenizer, preset_tokenizer
from worker.engine.backends.server import ServerTeacher
from worker.engine.data.prompts import Prompts, build_prompt
from worker.engine.loop.steps import run_loop
from worker.engine.rollouts.sampling import stop_sequences
from worker.engine.teachers.alignment import chained, spread
from worker.engine.teachers.cross_tokenizer import Retokenized, Tokenizers
from worker.engine.teachers.views import SERVED_TOP_K, served_top_k

QUESTIONS = ["What is 1 + 2?", "What is 4 + 4?", "What is 3 * 3?"]
SERVED = "served/teacher"
TEACHER = base_weights(SERVED)
K = 4


def bigram(tokens: list[int], position: int) -> np.ndarray:
    """The served teacher: the fake's bigram model of SERVED's weights."""
    return model.log_probs(TEACHER)[tokens[position - 1]]


@pytest.fixture
def fake() -> FakeVLLM:
    return FakeVLLM(row=bigram, decode=lambda token: model.TOKENIZER.decode([token]))


@pytest.fixture
def url(fake: FakeVLLM) -> Iterator[str]:
    with serving(fake) as base:
        yield base


def make_spec(url: str, backend: str = "trio", **changes: Any) -> JobSpec:
    server = {"url": url, "model": SERVED, "batch_size": 3, "retry_delay_seconds": 0.01}
    spec: dict[str, Any] = {
        "backend": backend,
        "student": {"base_model": "student/model", "lora_rank": 8},
        "teacher": {"server": server | changes.pop("server", {})},
        "dataset": {"source": "inline", "prompts": QUESTIONS, "question_suffix": ""},
        "sampling": {"max_tokens": 6},
        "loop": {"steps": 2, "batch_size": 2, "group_size": 2} | changes.pop("loop", {}),
        "tinker": {"call_retry_delay_seconds": 0.001},
    }
    return JobSpec.model_validate(spec | changes)


def pools() -> dict[str, Prompts]:
    return {"dataset": Prompts(QUESTIONS, ["3", "8", "9"])}


async def test_the_loop_trains_on_the_servers_scores_of_the_students_tokens(fake, url):
    service, sink = FakeServiceClient(), RecordingSink()
    await run_loop(make_spec(url), service, pools(), sink)

    [(_, message, data)] = [e for e in sink.events if e[2] and "chat_template" in e[2]]
    assert message == f"Teacher {SERVED!r}: server {url}, same tokenizer, same chat template"
    assert data == {"teacher": "teacher", "mode": "same", "chat_template": "same", "server": url}
    got, expected, scored = [], [], 0
    for step, call in enumerate(service.calls_named("forward_backward")):
        read = 0
        for datum in call.args["data"]:
            prompt, completion = completions_of(datum)
            teacher = model.score(TEACHER, prompt + completion)[len(prompt) :]
            student = datum.loss_fn_inputs["logprobs"].data[len(prompt) - 1 :]
            got += datum.loss_fn_inputs["advantages"].data[len(prompt) - 1 :]
            expected += list(-(np.array(student) - teacher))
            read += len(prompt) + len(completion)
        assert sink.steps[step]["usage/teacher_tokens"] == read
        assert sink.steps[step]["time/teacher_wait"] > 0  # its requests took >= 20 ms each
        scored += len(call.args["data"])
    assert_close(got, expected, what="the advantages")
    assert not service.calls_named("compute_logprobs"), "the backend scored nothing"
    # The probe, then each step's completions, up to batch_size prompts a request.
    prompts = [body["prompt"] for body in fake.bodies[1:]]
    assert all(isinstance(p[0], list) and len(p) <= 3 for p in prompts if isinstance(p[0], list))
    assert len(fake.bodies) - 1 < scored


async def test_a_server_that_reads_ids_otherwise_is_refused_before_step_0(fake, url):
    fake.decode = lambda token: f"<echo: auth=sk-secret {token}>"  # its answer text
    sink = RecordingSink()
    with pytest.raises(IncompatibleModels) as refused:
        await run_loop(make_spec(url), FakeServiceClient(), pools(), sink)
    message = str(refused.value)
    assert "reads token ids otherwise" in message and "token 0 (id " in message, message
    assert "sk-secret" not in message and "echo" not in message, message
    assert not any("sk-secret" in str(event) for event in sink.events)
    assert not sink.steps and len(fake.bodies) == 1


async def test_a_server_without_prompt_logprobs_fails_before_step_0(fake, url):
    fake.script = ["no_logprobs"]
    sink = RecordingSink()
    with pytest.raises(OPDError) as failed:
        await run_loop(make_spec(url), FakeServiceClient(), pools(), sink)
    assert failed.value.code == "teacher_server_protocol"
    assert not sink.steps


async def test_on_tinker_forward_kl_learns_the_servers_top_k_by_id(fake, url, monkeypatch):
    service = tinker_fake.FakeServiceClient()
    tinker_fake.patch_tinker(monkeypatch, service)
    objective = {"kind": "forward_kl", "top_k": K, "tail": False}
    spec = make_spec(
        url,
        "tinker",
        server={"protocol": "prompt_logprobs"},
        loop={"steps": 1, "objective": objective},
        student={"base_model": "org/student", "lora_rank": 8},
    )
    await run_loop(spec, connect(spec, Path("unused"), lambda *_: None), pools(), RecordingSink())

    assert {body["prompt_logprobs"] for body in fake.bodies[1:]} == {K}
    teacher = model.log_probs(TEACHER)
    [call] = [c for c in service.calls_named("forward_backward")]
    for datum in call.request.forward_backward_input.data:
        tokens = datum.model_input.to_ints()
        targets = datum.loss_fn_inputs["target_tokens"].to_numpy()
        weights = datum.loss_fn_inputs["weights"].to_numpy()
        completion = [p for p in range(len(tokens)) if weights[p].any()]
        assert completion
        for position in completion:
            kept = sorted(range(len(teacher)), key=lambda t: (-teacher[tokens[position], t], t))
            assert targets[position].tolist() == kept[:K]


async def test_a_server_over_another_tokenizer_scores_the_completions_text_in_its_own(url, fake):
    """`server.tokenizer` names a model over another tokenizer (a BPE, its own template):
    the server reads its own rendering and the completion's text in its own tokens, and
    the preflight says so with the probe's aligned fraction."""
    bpe = bpe_tokenizer()
    table = np.random.default_rng(7).normal(size=(len(bpe), len(bpe)))
    table -= np.logaddexp.reduce(table, axis=-1, keepdims=True)
    fake.row = lambda tokens, position: table[tokens[position - 1]]
    fake.decode = lambda token: bpe.decode([token])
    service, sink = FakeServiceClient(tokenizers={"bpe/teacher": bpe}), RecordingSink()
    spec = make_spec(url, server={"tokenizer": "bpe/teacher"}, loop={"steps": 1})
    await run_loop(spec, service, pools(), sink)

    [(_, message, data)] = [e for e in sink.events if e[2] and e[2].get("mode")]
    assert message.startswith(f"Teacher {SERVED!r}: server {url}, another tokenizer")
    assert data["mode"] == "cross" and data["server"] == url
    # The fake student's completions are random bytes, mostly no text: how much aligns
    # is the cross-tokenizer scorer's to say (tests/worker/engine/teachers/test_alignment.py).
    assert 0 <= data["aligned_bytes_fraction"] <= 1
    assert 0 <= sink.steps[0]["opd/aligned_bytes_fraction"] <= 1
    own = {tuple(build_prompt(bpe, q, "", False)) for q in QUESTIONS}
    scored = [p for body in fake.bodies for p in prompts_of(body)]
    assert scored and all(any(tuple(p[: len(r)]) == r for r in own) for p in scored)


@pytest.mark.parametrize("protocol", ["echo", "prompt_logprobs"])
async def test_a_server_over_another_tokenizer_gives_the_chain_rule_its_top_k(url, fake, protocol):
    """Under `prompt_logprobs` the server's top k by id reach the cross-tokenizer scorer,
    which maps them by the chain rule on bytes (`alignment.chained`, the `5` of `56` gets
    the mass of the teacher's tokens that begin with `5`); under `echo` (top logprobs by
    text) it maps the sampled logprobs (`alignment.spread`)."""
    bpe, student = bpe_tokenizer(), preset_tokenizer(ARITH_STUDENT)
    table = np.random.default_rng(3).normal(scale=2.0, size=(len(bpe), len(bpe)))
    table -= np.logaddexp.reduce(table, axis=-1, keepdims=True)
    fake.row = lambda tokens, position: table[tokens[position - 1]]
    fake.decode = lambda token: bpe.decode([token])
    options = TeacherServer(url=url, model=SERVED, tokenizer="bpe/teacher", protocol=protocol)
    client = ServerTeacher(options, bpe)
    tokenizers = Tokenizers.of(student, bpe, stop_sequences(student), served_top_k(options))
    prompt = build_prompt(bpe, "What is 7 * 8?", "", False)
    completion = student.encode("\\boxed{56}<|im_end|>", add_special_tokens=False)
    student_logprobs = [-0.1 * (i + 1) for i in range(len(completion))]
    try:
        scored = await Retokenized("t", client, prompt, tokenizers).score(
            completion, student_logprobs
        )
    finally:
        await client.aclose()

    # The teacher's own tokens, logprobs and top k, read from the fake's table.
    theirs, ended = tokenizers.teacher_tokens(completion)
    tokens = [*prompt, *theirs]
    rows = [table[tokens[p - 1]] for p in range(len(prompt), len(tokens))]
    logprobs = [float(row[t]) for row, t in zip(rows, theirs, strict=True)]
    ranked = [
        [(tokenizers.teacher.piece(t), float(row[t])) for t in np.argsort(-row)[:SERVED_TOP_K]]
        for row in rows
    ]
    alignment = tokenizers.align(completion, theirs, ended)
    pieces = tokenizers.pieces(completion, theirs, ended)
    chain = chained(*pieces, alignment, student_logprobs, logprobs, ranked)
    sampled = spread(student_logprobs, logprobs, alignment.runs)
    assert max(abs(a - b) for a, b in zip(chain, sampled, strict=True)) > 0.1
    [asked] = {body.get("prompt_logprobs") for body in fake.bodies}
    if protocol == "prompt_logprobs":
        assert asked == SERVED_TOP_K
        assert_close(scored.logprobs, chain, rtol=1e-6)
    else:
        assert asked is None
        assert_close(scored.logprobs, sampled, rtol=1e-6)


def prompts_of(body: dict[str, Any]) -> list[list[int]]:
    prompt = body["prompt"]
    return [prompt] if isinstance(prompt[0], int) else prompt
