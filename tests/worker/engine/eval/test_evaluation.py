"""Held-out evals in the loop, against the PyTRIO fake: on schedule, reproducible, figures
that match the eval's own samples, and a training run left exactly as it was."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from kernel.spec import JobSpec
from tests.fakes.sinks import RecordingSink
from tests.fakes.trio import FakeServiceClient
from tests.support import assert_close
from worker.engine.data.prompts import Prompts
from worker.engine.loop.state import SavedState
from worker.engine.loop.steps import run_loop

PROMPTS = ["What is 1 + 1?", "Name a prime.", "Is 9 square?"]
EVAL_PROMPTS = ["What is 2 + 2?", "What is 3 * 3?"]
EVAL_SEED = 77


def make_spec(eval_group: dict[str, Any] | None = None, **loop: Any) -> JobSpec:
    held_out = {"source": "inline", "prompts": EVAL_PROMPTS, "answers": ["4", "9"]}
    return JobSpec.model_validate(
        {
            "backend": "trio",
            "student": {"base_model": "student/model", "lora_rank": 8},
            "teacher": {"base_model": "teacher/model"},
            "dataset": {"source": "inline", "prompts": PROMPTS},
            "sampling": {"max_tokens": 6},
            "loop": {"steps": 4, "batch_size": 2, "group_size": 2, **loop},
            "eval": None
            if eval_group is None
            else {"dataset": held_out, "seed": EVAL_SEED, "max_tokens": 5, **eval_group},
        }
    )


async def even_first_token(completions: list[str], references: list[str]) -> list[bool]:
    """A grader the test can recompute: right when the answer's first character is even."""
    return [bool(text) and ord(text[0]) % 2 == 0 for text in completions]


async def run(spec: JobSpec, fake: FakeServiceClient, **kwargs: Any) -> RecordingSink:
    sink = RecordingSink()
    held_out = Prompts(EVAL_PROMPTS, ["4", "9"]) if spec.eval else None
    await run_loop(
        spec,
        fake,
        Prompts(PROMPTS, [None] * len(PROMPTS)),
        sink,
        eval_prompts=held_out,
        grade=even_first_token,
        **kwargs,
    )
    return sink


def training_part(metrics: dict[str, float]) -> dict[str, float]:
    return {
        k: v
        for k, v in metrics.items()
        if not k.startswith(("time/", "eval/"))
        and k not in ("data/completion_tokens_per_second", "usage/eval_tokens")
    }


def eval_part(metrics: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in metrics.items() if k.startswith("eval/")}


async def test_evals_run_on_schedule_and_leave_the_training_as_it_was():
    plain_fake, eval_fake = FakeServiceClient(), FakeServiceClient()
    plain = await run(make_spec(), plain_fake)
    evaluated = await run(make_spec({"every": 2}), eval_fake)

    assert {s: training_part(m) for s, m in evaluated.steps.items()} == {
        s: training_part(m) for s, m in plain.steps.items()
    }
    train_calls = [c.args["data"] for c in plain_fake.calls_named("forward_backward")]
    assert [c.args["data"] for c in eval_fake.calls_named("forward_backward")] == train_calls
    assert [s for s, m in evaluated.steps.items() if eval_part(m)] == [0, 2]
    assert list(evaluated.evals) == [4], "the eval after the last step has a row of its own"
    names = {"eval/reverse_kl_mean", "eval/accuracy", "eval/truncated_fraction"}
    for metrics in [evaluated.steps[0], evaluated.steps[2], evaluated.evals[4]]:
        assert names | {"eval/completion_tokens_mean"} <= metrics.keys()
        assert metrics["time/eval"] >= 0


async def test_an_eval_is_told_as_it_starts_prompt_by_prompt_and_as_it_ends():
    """A real model's eval takes minutes: before, nothing said it ran (no event, no bar)."""
    sink = await run(make_spec({"every": 2, "teacher_baseline": True}), FakeServiceClient())

    evals = [(message, data) for _, message, data in sink.events if data and "eval" in data]
    assert [(d["eval"], d["step"]) for _, d in evals] == [
        (edge, step) for step in (0, 2, 4) for edge in ("started", "finished")
    ]
    assert evals[0][0] == (
        "Evaluating after step 0: 4 held-out prompts to answer (the teacher's baseline among them)"
    )
    assert evals[1][0].startswith("Evaluated after step 0 in ") and "accuracy" in evals[1][0]
    told = [(p.phase, p.step, p.eval_done, p.eval_total) for p in sink.progress_told]
    assert told[:5] == [("evaluating", 0, done, 4) for done in range(5)]
    assert ("training", 0, None, None) in told and ("evaluating", 4, 2, 2) in told
    later = [p for p in sink.progress_told if p.phase == "training" and p.step == 3]
    assert later[0].eta_seconds is not None, "a step and an eval timed: the time left is known"


async def test_eval_figures_are_those_of_the_eval_s_own_samples():
    fake = FakeServiceClient()
    sink = await run(make_spec({"every": 0}, steps=2), fake)

    teacher = await fake.create_sampling_client_async("teacher/model")
    evals = [
        c
        for c in fake.calls_named("sample")
        if c.args["request"].sampling_params["seed"] == EVAL_SEED
    ]
    assert len(evals) == 2 * len(EVAL_PROMPTS), "before the first step and after the last"
    for calls, metrics in ((evals[:2], sink.steps[0]), (evals[2:], sink.evals[2])):
        sequences = [
            (call.args["request"].prompt.chunks[0].tokens, seq)
            for call in calls
            for seq in call.args["response"].sequences
        ]
        kls = np.concatenate(
            [
                np.subtract(
                    seq.logprobs, teacher.prompt_logprobs(prompt + seq.tokens)[len(prompt) :]
                )
                for prompt, seq in sequences
            ]
        )
        texts = [
            teacher.get_tokenizer().decode(seq.tokens, skip_special_tokens=True)
            for _, seq in sequences
        ]
        assert_close([metrics["eval/reverse_kl_mean"]], [kls.mean()])
        assert metrics["eval/accuracy"] == pytest.approx(np.mean(await even_first_token(texts, [])))
        assert metrics["eval/completion_tokens_mean"] == pytest.approx(
            np.mean([len(seq.tokens) for _, seq in sequences])
        )
        assert metrics["eval/truncated_fraction"] == pytest.approx(
            np.mean([seq.stop_reason == "length" for _, seq in sequences])
        )
        assert all(call.args["request"].sampling_params["max_tokens"] == 5 for call in calls)


async def test_a_resumed_run_reproduces_its_evals():
    spec = make_spec({"every": 2}, steps=4, save_every=2)
    fake = FakeServiceClient()
    whole = await run(spec, fake)
    state = next(path for step, kind, path in whole.checkpoints if (step, kind) == (2, "state"))

    resumed = await run(spec, fake, resume=SavedState(state, 2))

    assert eval_part(resumed.steps[2]) == eval_part(whole.steps[2])
    assert eval_part(resumed.evals[4]) == eval_part(whole.evals[4])


async def test_evals_leave_a_pipelined_run_as_it_was_and_resume_exactly():
    """With max_steps_off_policy, an eval waits for the rollouts already sampling and
    evaluates the weights of its boundary: the training is unchanged and a resumed run
    repeats the evals."""
    loop = {"steps": 5, "save_every": 2, "max_steps_off_policy": 1}
    plain_fake, eval_fake = FakeServiceClient(), FakeServiceClient()
    await run(make_spec(**loop), plain_fake)
    whole = await run(make_spec({"every": 2}, **loop), eval_fake)

    train_calls = [c.args["data"] for c in plain_fake.calls_named("forward_backward")]
    assert [c.args["data"] for c in eval_fake.calls_named("forward_backward")] == train_calls
    assert [s for s, m in whole.steps.items() if eval_part(m)] == [0, 2, 4]
    on_policy = await run(make_spec({"every": 2}, steps=1), FakeServiceClient())
    assert eval_part(whole.steps[0]) == eval_part(on_policy.steps[0]), "the initial weights"

    saved = {(step, kind): path for step, kind, path in whole.checkpoints}
    samplers = {step: path for (step, kind), path in saved.items() if kind == "sampler"}
    resumed = await run(
        make_spec({"every": 2}, **loop),
        eval_fake,
        resume=SavedState(saved[4, "state"], 4, samplers),
    )
    assert eval_part(resumed.steps[4]) == eval_part(whole.steps[4])
    assert eval_part(resumed.evals[5]) == eval_part(whole.evals[5])


async def test_the_teacher_baseline_and_pass_at_k():
    sink = await run(
        make_spec({"teacher_baseline": True, "samples_per_prompt": 3}, steps=1), FakeServiceClient()
    )

    first = sink.steps[0]
    assert {"eval/teacher_accuracy", "eval/teacher_truncated_fraction"} <= first.keys()
    assert "eval/teacher_accuracy" not in sink.evals[1], "the teacher answers once"
    assert first["eval/pass@3"] >= first["eval/accuracy"]


async def test_steps_keep_a_few_rollouts_with_their_reverse_kl():
    fake = FakeServiceClient()
    sink = await run(make_spec(steps=2, keep_samples=2), fake)

    assert sorted(sink.kept) == [0, 1]
    assert [len(kept) for kept in sink.kept.values()] == [2, 2]
    first = sink.kept[0][0]
    call = fake.calls_named("sample")[0]
    prompt = call.args["request"].prompt.chunks[0].tokens
    sample = call.args["response"].sequences[0]
    teacher = await fake.create_sampling_client_async("teacher/model")
    expected = np.subtract(
        sample.logprobs, teacher.prompt_logprobs(prompt + sample.tokens)[len(prompt) :]
    )
    assert first.prompt == PROMPTS[0]
    assert len(first.tokens) == len(sample.tokens) and not first.truncated
    assert_close(first.reverse_kl, expected)
    assert first.completion == teacher.get_tokenizer().decode(
        sample.tokens, skip_special_tokens=True
    )


async def test_a_format_grader_grades_every_answer_without_the_reference_answers():
    """eval.grader {regex}: every completion is graded by its form alone, the references
    left unread (here the eval's prompts have none): a pattern matching anything accepts
    them all, one matching nothing none."""
    figures = {}
    for pattern in ("(?s).*", "(?!)"):
        spec = make_spec({"teacher_baseline": True, "grader": {"regex": pattern}}, steps=1)
        sink = RecordingSink()
        await run_loop(
            spec,
            FakeServiceClient(),
            Prompts(PROMPTS, [None] * len(PROMPTS)),
            sink,
            eval_prompts=Prompts(EVAL_PROMPTS, [None, None]),
        )
        figures[pattern] = sink.steps[0]

    for key in ("eval/accuracy", "eval/teacher_accuracy"):
        assert (figures["(?s).*"][key], figures["(?!)"][key]) == (1.0, 0.0), key
