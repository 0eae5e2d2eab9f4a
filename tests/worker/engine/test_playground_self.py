"""The playground of a job whose teacher is a self teacher: the teacher reads its context
(system line, example turns, the reference answer given), which its output shows beside
the student's own prompt, and scores the checkpoint's completions after it as training
does: with the base model (`base`) or the checkpoint itself (`current`)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from kernel.errors import OPDError
from kernel.playground import SampleRequest, SampleTask
from kernel.spec import JobSpec
from tests.support import assert_close
from tests.worker.engine.conftest import Trained
from tests.worker.engine.test_playground import QUESTION, cache_for, scores, tokenizer_of
from worker.engine.data.prompts import build_chat, build_prompt
from worker.engine.playground import answer

SYSTEM = "Answer with the number only, no words."
EXAMPLE = {"user": "What is 3 + 4?", "assistant": "7"}


def self_task(trained: Trained, context: dict[str, Any], **request: object) -> SampleTask:
    fields = trained.spec.model_dump()
    fields["teacher"] = {"self": {"system": SYSTEM, "examples": [EXAMPLE], **context}}
    fields["dataset"]["answers"] = ["?"] * len(fields["dataset"]["prompts"])
    settings = {"prompt": QUESTION, "max_tokens": 8, "compare": ["teacher"]} | request
    return SampleTask(
        request=SampleRequest.model_validate(settings),
        spec=JobSpec.model_validate(fields),
        weights_path=trained.final,
        deadline=time.time() + 60,
    )


def context(tokenizer: Any, last: str) -> list[int]:
    return build_chat(
        tokenizer,
        [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": EXAMPLE["user"]},
            {"role": "assistant", "content": EXAMPLE["assistant"]},
            {"role": "user", "content": last},
        ],
        False,
    )


@pytest.mark.parametrize("weights", ["base", "current"])
async def test_the_teacher_reads_its_context_beside_the_students_prompt(trained, weights):
    got = await answer(
        self_task(trained, {"weights": weights, "reference": True}, reference="5", n=2),
        cache_for(trained.artifacts),
    )

    tokenizer = await tokenizer_of(trained)
    student_prompt = build_prompt(tokenizer, QUESTION, "", False)
    teachers_prompt = context(tokenizer, f"{QUESTION}\n\nReference answer: 5")
    checkpoint, teacher = got.outputs
    assert (checkpoint.model, teacher.model) == ("checkpoint", "teacher")
    assert checkpoint.prompt_token_ids == student_prompt and SYSTEM not in checkpoint.prompt
    assert teacher.prompt_token_ids == teachers_prompt
    assert SYSTEM in teacher.prompt and "Reference answer: 5" in teacher.prompt
    assert teacher.base_model == trained.spec.student.base_model
    assert teacher.weights == (trained.final if weights == "current" else None)
    for completion in checkpoint.completions:
        expected = await scores(
            trained, teacher.weights, "tiny-student", teachers_prompt, completion.token_ids
        )
        assert_close(completion.teacher_logprobs, expected, what="scored after the context")


async def test_a_chat_gets_the_context_before_it(trained):
    messages = [{"role": "user", "content": QUESTION}]
    got = await answer(
        self_task(trained, {}, prompt=None, messages=messages), cache_for(trained.artifacts)
    )

    teacher = got.outputs[1]
    assert teacher.prompt_token_ids == context(await tokenizer_of(trained), QUESTION)


async def test_a_reference_reading_teacher_without_a_reference_is_an_invalid_prompt(trained):
    with pytest.raises(OPDError, match="give it as reference"):
        await answer(self_task(trained, {"reference": True}), cache_for(trained.artifacts))
