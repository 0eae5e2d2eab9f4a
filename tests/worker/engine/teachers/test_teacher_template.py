"""A teacher whose tokenizer is the student's but whose chat template is its own, against the
PyTRIO fake: the preflight accepts it and says so, and every request it gets (training,
several teachers routed or mixed, the probe, the eval and its baseline) is its own
rendering of the question followed by the student's completion."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kernel.spec import EvalSpec, JobSpec
from tests.fakes import model
from tests.fakes import tinker as tinker_fake
from tests.fakes.sinks import RecordingSink
from tests.fakes.trio import Call, FakeServiceClient, base_weights
from tests.support import assert_close
from worker.engine.backends import connect
from worker.engine.backends.local.presets import SYSTEM_CHAT_TEMPLATE, tiny_tokenizer
from worker.engine.data.prompts import Prompts, build_prompt
from worker.engine.loop.steps import run_loop

QUESTIONS = ["What is 1 + 2?", "What is 4 + 4?", "What is 3 * 3?"]
ANSWERS = ["3", "8", "9"]
SUFFIX = "Box it."
STUDENT, OWN, SAME = "student/model", "teacher/own", "teacher/same"
OWN_TOKENIZER = tiny_tokenizer(SYSTEM_CHAT_TEMPLATE)
TOPK = {"kind": "forward_kl", "top_k": 4, "tail": False}


def rendered(tokenizer: Any) -> dict[tuple[int, ...], str]:
    """Each question's prompt as `tokenizer` renders it."""
    return {tuple(build_prompt(tokenizer, q, SUFFIX, False)): q for q in QUESTIONS}


STUDENTS, OWNS = rendered(model.TOKENIZER), rendered(OWN_TOKENIZER)


def make_spec(teachers: dict[str, str], mixture: str = "mixture", **loop: Any) -> JobSpec:
    """One dataset (`several` False: one teacher) or two, scored by `teachers`."""
    several = len(teachers) > 1
    inline = {"source": "inline", "prompts": QUESTIONS, "question_suffix": SUFFIX}
    datasets = [
        inline | {"name": name} | ({"teacher": name} if mixture == "route" else {})
        for name in teachers
    ]
    chosen: dict[str, Any] = (
        {"teachers": {name: {"base_model": m} for name, m in teachers.items()}}
        if several
        else {"teacher": {"base_model": next(iter(teachers.values()))}}
    )
    return JobSpec.model_validate(
        {
            "backend": "trio",
            "student": {"base_model": STUDENT, "lora_rank": 8},
            **chosen,
            **({"datasets": datasets} if several else {"dataset": inline}),
            **({"teacher_mixture": mixture} if several else {}),
            "sampling": {"max_tokens": 6},
            "optim": {"learning_rate": 1e-4},
            "loop": {"batch_size": 2, "group_size": 2, "kl_penalty_coef": 1.0, **loop},
        }
    )


def pools(spec: JobSpec) -> dict[str, Prompts]:
    return {share.name: Prompts(QUESTIONS, ANSWERS) for share in spec.dataset_shares()}


async def run(spec: JobSpec, **kwargs: Any) -> tuple[FakeServiceClient, RecordingSink]:
    fake = FakeServiceClient(tokenizers={OWN: OWN_TOKENIZER})
    sink = RecordingSink()
    await run_loop(spec, fake, pools(spec), sink, **kwargs)
    return fake, sink


def prompt_of(call: Call) -> list[int]:
    return call.args["request"].prompt.chunks[0].tokens


def split(tokens: list[int], renderings: dict[tuple[int, ...], str]) -> list[int] | None:
    """The tokens after the rendering they start with; None if none of `renderings`."""
    for prompt in renderings:
        if tuple(tokens[: len(prompt)]) == prompt:
            return tokens[len(prompt) :]
    return None


def completions_of(datum: Any) -> tuple[list[int], list[int]]:
    """(student prompt, completion) of a datum."""
    tokens = datum.model_input.to_ints()
    targets = datum.loss_fn_inputs["target_tokens"].data
    start = next(i for i, t in enumerate(targets) if t)
    return tokens[: start + 1], list(targets[start:])


def assert_each_teacher_read_its_own_rendering(fake: FakeServiceClient) -> None:
    """Every request a teacher got starts with its rendering of a question; the student's
    samples start with the student's."""
    own = base_weights(OWN)
    teachers = {own, base_weights(SAME)}
    scored = fake.calls_named("compute_logprobs")
    assert {c.args["weights"] for c in scored} & teachers
    for call in scored:
        mine = OWNS if call.args["weights"] == own else STUDENTS
        assert split(prompt_of(call), mine), call.args["weights"]
    for call in fake.calls_named("sample"):
        if call.args["weights"] == own:  # the teacher baseline
            assert tuple(prompt_of(call)) in OWNS
        elif call.args["weights"] not in teachers:
            assert tuple(prompt_of(call)) in STUDENTS


async def test_the_preflight_accepts_a_teacher_with_its_own_template_and_says_so():
    _, sink = await run(make_spec({"own": OWN, "same": SAME}, steps=1))

    said = {data["teacher"]: text for _, text, data in sink.events if data and "teacher" in data}
    assert said == {
        "own": "Teacher 'own' ('teacher/own'): same tokenizer, its own chat template",
        "same": "Teacher 'same' ('teacher/same'): same tokenizer, same chat template",
    }
    assert OWNS.keys().isdisjoint(STUDENTS.keys())


async def test_the_teacher_scores_its_own_rendering_then_the_students_completion():
    spec = make_spec({"teacher": OWN}, steps=2).model_copy(
        update={"eval": EvalSpec(every=1, holdout=2, teacher_baseline=True)}
    )
    fake, sink = await run(spec, eval_prompts=pools(spec))

    own = base_weights(OWN)
    requests = {tuple(prompt_of(c)) for c in fake.calls_named("compute_logprobs")}
    got, expected = [], []
    for step, call in enumerate(fake.calls_named("forward_backward")):
        scored_tokens = 0
        for datum in call.args["data"]:
            prompt, completion = completions_of(datum)
            question = STUDENTS[tuple(prompt)]
            theirs = build_prompt(OWN_TOKENIZER, question, SUFFIX, False)
            assert (*theirs, *completion) in requests
            teacher = model.score(own, theirs + completion)[len(theirs) :]
            student = datum.loss_fn_inputs["logprobs"].data[len(prompt) - 1 :]
            got += datum.loss_fn_inputs["advantages"].data[len(prompt) - 1 :]
            expected += list(-(np.array(student) - teacher))
            scored_tokens += len(theirs) + len(completion)
        assert sink.steps[step]["usage/teacher_tokens"] == scored_tokens
    assert_close(got, expected, what="the advantages")
    assert_each_teacher_read_its_own_rendering(fake)
    assert "eval/teacher_completion_tokens_mean" in sink.steps[0]  # the baseline ran
    baseline = [c for c in fake.calls_named("sample") if c.args["weights"] == own]
    assert {tuple(prompt_of(c)) for c in baseline} == set(OWNS)


@pytest.mark.parametrize("mixture", ["route", "mixture"])
async def test_several_teachers_each_read_their_own_rendering(mixture):
    """Route, mixture and the probe before step 0 (with an eval too)."""
    spec = make_spec({"own": OWN, "same": SAME}, mixture, steps=2).model_copy(
        update={"eval": EvalSpec(every=1, holdout=2, teacher_baseline=mixture == "route")}
    )
    fake, sink = await run(spec, eval_prompts=pools(spec))

    assert_each_teacher_read_its_own_rendering(fake)
    probes = [data for _, message, data in sink.events if message.startswith("Probe reverse KL")]
    assert len(probes) == 1 and set(probes[0]["reverse_kl"]) == {"own", "same"}
    if mixture == "route":
        return
    weights = np.log(np.array([0.5, 0.5]))
    got, expected = [], []
    for call in fake.calls_named("forward_backward"):
        for datum in call.args["data"]:
            prompt, completion = completions_of(datum)
            theirs = build_prompt(OWN_TOKENIZER, STUDENTS[tuple(prompt)], SUFFIX, False)
            scores = [
                model.score(base_weights(OWN), theirs + completion)[len(theirs) :],
                model.score(base_weights(SAME), prompt + completion)[len(prompt) :],
            ]
            mixed = np.logaddexp.reduce(weights[:, None] + np.array(scores), axis=0)
            student = datum.loss_fn_inputs["logprobs"].data[len(prompt) - 1 :]
            got += datum.loss_fn_inputs["advantages"].data[len(prompt) - 1 :]
            expected += list(-(np.array(student) - mixed))
    assert_close(got, expected, what="the mixture's advantages")


async def test_a_teacher_with_the_students_template_gets_the_students_prompt():
    fake, sink = await run(make_spec({"teacher": SAME}, steps=1))

    [(_, message, data)] = [e for e in sink.events if e[2] and "chat_template" in e[2]]
    assert message == "Teacher 'teacher/same': same tokenizer, same chat template"
    assert data == {"teacher": "teacher", "mode": "same", "chat_template": "same"}
    assert all(split(prompt_of(c), STUDENTS) for c in fake.calls_named("compute_logprobs"))


def other_eos() -> Any:
    tokenizer = tiny_tokenizer(SYSTEM_CHAT_TEMPLATE)
    tokenizer.eos_token = "<|endoftext|>"
    return tokenizer


def other_vocab() -> Any:
    tokenizer = tiny_tokenizer(SYSTEM_CHAT_TEMPLATE)
    tokenizer.add_tokens(["<extra>"])
    return tokenizer


@pytest.mark.parametrize("tokenizer", [other_vocab, other_eos])
async def test_another_vocabulary_or_eos_makes_a_cross_tokenizer_teacher(tokenizer):
    """Once refused, now read as another tokenizer: the completion's text re-tokenized, the
    student's end of sequence read as the teacher's own."""
    theirs = tokenizer()
    fake = FakeServiceClient(tokenizers={OWN: theirs})
    sink = RecordingSink()
    spec = make_spec({"teacher": OWN}, steps=2)

    await run_loop(spec, fake, pools(spec), sink)

    [(_, message, data)] = [e for e in sink.events if e[2] and e[2].get("mode")]
    assert data["mode"] == "cross"
    assert message.startswith("Teacher 'teacher/own': another tokenizer")
    # The fake samples any bytes, invalid UTF-8 too, which the teacher cannot reproduce.
    assert all(0 < m["opd/aligned_bytes_fraction"] <= 1 for m in sink.steps.values())
    scored = [c for c in fake.calls_named("sample") if c.args["request"].topk_prompt_logprobs]
    ends = {prompt_of(call)[-1] for call in scored}
    assert theirs.eos_token_id in ends
    if theirs.eos_token_id != model.EOS:
        assert model.EOS not in ends, "the student's EOS is the teacher's own"


async def test_on_tinker_the_teachers_top_k_comes_from_its_own_rendering(monkeypatch):
    """forward_kl over the teacher's top-k (Tinker): the teacher's scoring requests are its
    own rendering + the completion, so its top-k positions are the completion's."""
    monkeypatch.setattr(
        tinker_fake.FakeSamplingClient,
        "get_tokenizer",
        lambda self: OWN_TOKENIZER if self.base_model == "tiny-teacher" else model.TOKENIZER,
    )
    service = tinker_fake.FakeServiceClient()
    tinker_fake.patch_tinker(monkeypatch, service)
    spec = JobSpec.model_validate(
        {
            "backend": "tinker",
            "student": {"base_model": "tiny-student", "lora_rank": 8},
            "teacher": {"base_model": "tiny-teacher"},
            "dataset": {"source": "inline", "prompts": QUESTIONS, "question_suffix": SUFFIX},
            "sampling": {"max_tokens": 6},
            "loop": {"steps": 1, "batch_size": 2, "group_size": 2, "objective": TOPK},
            "tinker": {"call_retry_delay_seconds": 0.001},
        }
    )
    sink = RecordingSink()

    await run_loop(spec, connect(spec, Path("unused"), lambda *_: None), pools(spec), sink)

    teacher = tinker_fake.base_weights("tiny-teacher")
    scored = [c for c in service.calls_named("sample") if c.weights == teacher]
    assert scored and all(c.request.topk_prompt_logprobs == 4 for c in scored)
    for call in scored:
        assert split(call.request.prompt.to_ints(), OWNS), call.request.prompt.to_ints()
    assert sink.steps[0]["data/datums"] >= 1
