"""The usage/* metrics against what the PyTRIO fake recorded: every token the student
sampled, the teacher scored and the trainer trained on, counted independently from the
calls themselves (the fake records each one)."""

from __future__ import annotations

from typing import Any

from tests.fakes.trio import Call, FakeServiceClient
from tests.worker.engine.eval.test_evaluation import EVAL_SEED, make_spec, run

SAMPLED, TEACHER, TRAINED, EVAL = (
    "usage/sampled_tokens",
    "usage/teacher_tokens",
    "usage/trained_tokens",
    "usage/eval_tokens",
)


def prompt_tokens(request: Any) -> list[int]:
    return [token for chunk in request.prompt.chunks for token in chunk.tokens]


def is_eval(call: Call) -> bool:
    """Evals sample with their own seed (the teacher baseline too)."""
    return call.args["request"].sampling_params.get("seed") == EVAL_SEED


def sampled(call: Call) -> int:
    return sum(len(seq.tokens) for seq in call.args["response"].sequences)


def scored(call: Call) -> int:
    """What the teacher scores for this sample call: prompt + completion of each sequence."""
    prompt = len(prompt_tokens(call.args["request"]))
    return sum(prompt + len(seq.tokens) for seq in call.args["response"].sequences if seq.tokens)


async def test_usage_metrics_count_the_tokens_of_every_call():
    fake = FakeServiceClient()
    spec = make_spec({"every": 2, "teacher_baseline": True}, steps=3)

    sink = await run(spec, fake)

    samples = fake.calls_named("sample")
    training = [call for call in samples if not is_eval(call)]
    evals = [call for call in samples if is_eval(call)]
    per_step = len(training) // spec.loop.steps  # one sample call per prompt, steps in order
    assert per_step == spec.loop.batch_size
    for step in range(spec.loop.steps):
        calls = training[step * per_step : (step + 1) * per_step]
        assert sink.steps[step][SAMPLED] == sum(sampled(call) for call in calls)
        assert sink.steps[step][TEACHER] == sum(scored(call) for call in calls)
    for step, call in enumerate(fake.calls_named("forward_backward")):
        datums = call.args["data"]
        assert sink.steps[step][TRAINED] == sum(d.model_input.length for d in datums)
        assert sink.steps[step][TRAINED] == call.args["plan"].totals.total_active_tokens

    scored_by_teacher = sum(
        len(prompt_tokens(call.args["request"])) for call in fake.calls_named("compute_logprobs")
    )
    total = {name: sum(m.get(name, 0) for m in sink.steps.values()) for name in (TEACHER, EVAL)}
    eval_total = total[EVAL] + sum(m[EVAL] for m in sink.evals.values())
    assert total[TEACHER] + eval_total - sum(sampled(c) for c in evals) == scored_by_teacher
    assert eval_total == sum(sampled(call) + scored(call) for call in evals)
    # Evals at steps 0 and 2 (0 with the teacher's baseline) and after the last step.
    assert sorted(step for step, m in sink.steps.items() if EVAL in m) == [0, 2]
    assert list(sink.evals) == [3]
