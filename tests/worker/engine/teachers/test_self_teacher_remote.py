"""A self teacher on the remote backends, against their fakes: `base` weights score with a
sampler of the base model there (the student's weights move on, the teacher's never), and
`current` with each step's own sampler; every score reads the teacher's context, never the
student's prompt. On Tinker it brings the teacher's top k for forward_kl too."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kernel.spec import JobSpec
from tests.fakes import model
from tests.fakes import tinker as tinker_fake
from tests.fakes.sinks import RecordingSink
from tests.fakes.trio import FakeServiceClient, base_weights
from worker.engine.backends import connect
from worker.engine.data.prompts import Prompts, build_chat, build_prompt
from worker.engine.loop.steps import run_loop

QUESTIONS = ["What is 1 + 2?", "What is 4 + 4?", "What is 3 * 3?"]
ANSWERS = ["3", "8", "9"]
SYSTEM = "Answer with the number only."
STUDENT = "student/model"


def spec_for(backend: str, weights: str, **loop: Any) -> JobSpec:
    return JobSpec.model_validate(
        {
            "backend": backend,
            "student": {"base_model": STUDENT, "lora_rank": 8},
            "teacher": {"self": {"weights": weights, "system": SYSTEM, "reference": True}},
            "dataset": {"source": "inline", "prompts": QUESTIONS, "answers": ANSWERS},
            "sampling": {"max_tokens": 6},
            "optim": {"learning_rate": 1e-2},
            "loop": {"steps": 3, "batch_size": 2, "group_size": 2, **loop},
            "tinker": {"call_retry_delay_seconds": 0.001},
        }
    )


def contexts(tokenizer: Any, suffix: str) -> list[tuple[int, ...]]:
    """Each question as the self teacher reads it: the system line, then the question and
    its reference answer."""
    return [
        tuple(
            build_chat(
                tokenizer,
                [
                    {"role": "system", "content": SYSTEM},
                    {"role": "user", "content": f"{q}\n\n{suffix}\n\nReference answer: {a}"},
                ],
                False,
            )
        )
        for q, a in zip(QUESTIONS, ANSWERS, strict=True)
    ]


def read_after(tokens: list[int], prompts: list[tuple[int, ...]]) -> bool:
    return any(tuple(tokens[: len(prompt)]) == prompt for prompt in prompts)


@pytest.mark.parametrize("weights", ["base", "current"])
async def test_on_trio_the_self_teacher_scores_its_context_with_its_weights(weights):
    spec = spec_for("trio", weights)
    fake = FakeServiceClient()
    await run_loop(spec, fake, Prompts(QUESTIONS, ANSWERS), RecordingSink())

    suffix = spec.dataset.question_suffix
    mine = contexts(model.TOKENIZER, suffix)
    students = [tuple(build_prompt(model.TOKENIZER, q, suffix, False)) for q in QUESTIONS]
    sampled = [c.args["weights"] for c in fake.calls_named("sample")]
    scored = fake.calls_named("compute_logprobs")
    assert len(set(sampled)) == 3, "the student's weights move on every step"
    assert scored and all(
        read_after(c.args["request"].prompt.chunks[0].tokens, mine) for c in scored
    )
    assert not any(read_after(c.args["request"].prompt.chunks[0].tokens, students) for c in scored)
    if weights == "base":
        assert {c.args["weights"] for c in scored} == {base_weights(STUDENT)}
    else:
        # Each prompt's two completions, scored by the sampler that drew them.
        expected = [w for w in sampled for _ in range(spec.loop.group_size)]
        assert sorted(c.args["weights"] for c in scored) == sorted(expected)


async def test_on_tinker_the_self_teacher_brings_its_top_k_from_its_context(monkeypatch):
    spec = spec_for(
        "tinker", "current", objective={"kind": "forward_kl", "top_k": 4, "tail": False}
    )
    service = tinker_fake.FakeServiceClient()
    tinker_fake.patch_tinker(monkeypatch, service)
    backend = connect(spec, Path("unused"), lambda *_: None)
    await run_loop(spec, backend, Prompts(QUESTIONS, ANSWERS), RecordingSink())

    mine = contexts(model.TOKENIZER, spec.dataset.question_suffix)
    scored = [c for c in service.calls_named("sample") if c.request.topk_prompt_logprobs]
    drawn = [c for c in service.calls_named("sample") if not c.request.topk_prompt_logprobs]
    assert scored and all(read_after(c.request.prompt.to_ints(), mine) for c in scored)
    assert {c.weights for c in scored} == {c.weights for c in drawn}, "the step's own sampler"
