"""The local backend with `arith-teacher-template`, a teacher trained with a chat template of
its own over the student's tokens: the preflight takes it and says so, and scored from its
own rendering it finds the right answers far likelier than from the student's."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from kernel.model_names import ARITH_STUDENT, ARITH_TEACHER_TEMPLATE
from kernel.spec import ArithmeticDataset, JobSpec, LocalBackendSpec
from tests.fakes.sinks import RecordingSink
from worker.engine.backends.local import LocalServiceClient
from worker.engine.backends.local.presets import preset_tokenizer
from worker.engine.data.arithmetic import training_problems
from worker.engine.data.prompts import Prompts, build_prompt
from worker.engine.loop.steps import run_loop
from worker.engine.teachers.scoring import teacher_logprobs

SUFFIX = ArithmeticDataset().question_suffix


async def test_the_teacher_scores_right_answers_better_from_its_own_rendering(tmp_path: Path):
    service = LocalServiceClient(LocalBackendSpec(device="cpu"), tmp_path)
    teacher = await service.create_sampling_client_async(ARITH_TEACHER_TEMPLATE)
    own, students = preset_tokenizer(ARITH_TEACHER_TEMPLATE), preset_tokenizer(ARITH_STUDENT)
    problems = training_problems(ArithmeticDataset(digits=1, multiplier_digits=1, count=24))
    mine, theirs = [], []
    for problem in problems:
        answer = own.encode(f"\\boxed{{{problem.answer}}}", add_special_tokens=False)
        completion = [*answer, own.eos_token_id]
        for tokenizer, scores in ((own, mine), (students, theirs)):
            prompt = build_prompt(tokenizer, problem.question, SUFFIX, False)
            scores.append(sum(await teacher_logprobs(teacher, prompt, completion)))

    # Nats per right answer (about 10 tokens): -0.01 from its own rendering, -7.0 from
    # the student's, which it never saw.
    assert np.mean(mine) > -1.0, mine
    assert np.mean(mine) > np.mean(theirs) + 1.0, (np.mean(mine), np.mean(theirs))


async def test_a_run_with_it_says_the_teacher_has_its_own_template(tmp_path: Path):
    spec = JobSpec.model_validate(
        {
            "backend": "local",
            "local": {"device": "cpu"},
            "student": {"base_model": ARITH_STUDENT, "lora_rank": 4},
            "teacher": {"base_model": ARITH_TEACHER_TEMPLATE},
            "dataset": {"source": "inline", "prompts": ["What is 2 + 3?"]},
            "sampling": {"max_tokens": 8},
            "loop": {"steps": 1, "batch_size": 1, "group_size": 2},
        }
    )
    sink = RecordingSink()

    service = LocalServiceClient(spec.local, tmp_path)
    await run_loop(spec, service, Prompts(["What is 2 + 3?"], ["5"]), sink)

    assert (
        "info",
        "Teacher 'arith-teacher-template': same tokenizer, its own chat template",
        {"teacher": "teacher", "mode": "own", "chat_template": "own"},
    ) in sink.events
    assert sink.steps[0]["data/datums"] >= 1
