"""A self teacher on the local backend's tiny models: the student's own model reading a
context the student does not see. With `base` weights it scores as the base model loaded
beside it would after that context (the adapter off, no second copy), with `current` as
the sampler of the completion; the student's prompt never changes; every objective reads
it after its context; a pipelined run resumes exactly."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from pytrio.errors.base import ValidationError
from pytrio.types import AdamParams, ModelInput

from kernel.errors import IncompatibleModels
from kernel.spec import JobSpec, ObjectiveSpec
from tests.fakes.sinks import RecordingSink
from tests.support import assert_close
from tests.worker.engine.backends.test_local_state import assert_same_training, pipelined, run
from worker.engine.backends.contract import TeacherShare
from worker.engine.backends.local import LocalServiceClient
from worker.engine.backends.local.presets import tiny_model, tiny_tokenizer
from worker.engine.data.mixing import Item, training_pools
from worker.engine.data.prompts import Prompts, build_chat, build_prompt
from worker.engine.loop.run import evaluation_for, open_run
from worker.engine.loop.state import SavedState
from worker.engine.loop.steps import run_loop
from worker.engine.rollouts.datums import build_opd_datum
from worker.engine.teachers.scoring import teacher_logprobs

SYSTEM = "Answer with the number only, no words."
EXAMPLE = {"user": "What is 3 + 4?", "assistant": "7"}
CONTEXT = {"system": SYSTEM, "examples": [EXAMPLE]}
QUESTIONS = ["What is 2 + 3?", "Compute 7 * 8.", "Is 9 prime?"]
ANSWERS = ["5", "56", "no"]
COMPLETION = [*b"It is 5.", 258]  # the byte tokens of a short answer, then <|im_end|>
NO_SYSTEM_TEMPLATE = (
    "{%- for m in messages %}{%- if m['role'] == 'system' %}"
    "{{ raise_exception('System role not supported') }}{%- endif %}"
    "{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
)


def self_spec(teacher: dict[str, Any], **groups: Any) -> JobSpec:
    return JobSpec.model_validate(
        {
            "backend": "local",
            "local": {"device": "cpu"},
            "student": {"base_model": "tiny-student", "lora_rank": 8, "seed": 11},
            "teacher": teacher,
            "dataset": {"source": "inline", "prompts": QUESTIONS, "answers": ANSWERS},
            "sampling": {"max_tokens": 8},
            "optim": {"learning_rate": 1e-3},
            "loop": {"steps": 3, "batch_size": 2, "group_size": 2},
            **groups,
        }
    )


def context_prompt(tokenizer: Any, question: str, suffix: str, reference: str = "") -> list[int]:
    """The self teacher's rendering, written out: system, the example, then the question."""
    content = f"{question}\n\n{suffix}" if suffix else question
    if reference:
        content += f"\n\nReference answer: {reference}"
    return build_chat(
        tokenizer,
        [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": EXAMPLE["user"]},
            {"role": "assistant", "content": EXAMPLE["assistant"]},
            {"role": "user", "content": content},
        ],
        False,
    )


async def opened(spec: JobSpec, tmp_path: Path) -> Any:
    """The run of `spec` opened, its LoRA drawn at random (as after some training)."""
    service = LocalServiceClient(spec.local, tmp_path)
    pools = training_pools(spec, Prompts(QUESTIONS, ANSWERS))
    run = await open_run(spec, service, RecordingSink(), None, pools)
    with torch.no_grad():
        for param in run.training.trainable.values():
            param.normal_(std=0.05)
    return service, run, pools[0]


@pytest.mark.parametrize("reference", [False, True])
async def test_a_base_self_teacher_scores_as_the_base_model_after_its_context(tmp_path, reference):
    spec = self_spec({"self": CONTEXT | {"reference": reference}})
    service, run, pool = await opened(spec, tmp_path)
    sampler = await run.training.save_weights_and_get_sampling_client_async()
    before = await sampler.compute_logprobs_async(ModelInput.from_ints([*b"hello", 258]))
    item = Item(QUESTIONS[0], ANSWERS[0], pool)
    student_prompt = run.render(item.prompt, pool.options)

    scorer = run.scorer(item, student_prompt, sampler)
    scored = await scorer.score(COMPLETION, [0.0] * len(COMPLETION))

    tokenizer = run.tokenizer
    suffix = spec.dataset.question_suffix
    mine = context_prompt(tokenizer, QUESTIONS[0], suffix, ANSWERS[0] if reference else "")
    assert scorer.prompt == mine and mine != student_prompt
    assert student_prompt == build_prompt(tokenizer, QUESTIONS[0], suffix, False)
    base = await service.create_sampling_client_async("tiny-student")
    assert_close(scored.logprobs, await teacher_logprobs(base, mine, COMPLETION))
    # Not the student's own weights (its random LoRA), and not without the context.
    adapted = await teacher_logprobs(sampler, mine, COMPLETION)
    plain = await teacher_logprobs(base, student_prompt, COMPLETION)
    for other in (adapted, plain):
        assert max(abs(a - b) for a, b in zip(scored.logprobs, other, strict=True)) > 1e-3
    # The training state is as it was: the adapter on, its weights trainable.
    assert all(param.requires_grad for param in run.training.trainable.values())
    after = await sampler.compute_logprobs_async(ModelInput.from_ints([*b"hello", 258]))
    assert after == before


async def test_a_current_self_teacher_scores_with_the_sampler_of_the_completion(tmp_path):
    spec = self_spec({"self": CONTEXT | {"weights": "current"}})
    _, run, pool = await opened(spec, tmp_path)
    sampler = await run.training.save_weights_and_get_sampling_client_async()
    item = Item(QUESTIONS[1], ANSWERS[1], pool)

    scorer = run.scorer(item, run.render(item.prompt, pool.options), sampler)
    scored = await scorer.score(COMPLETION, [0.0] * len(COMPLETION))

    mine = context_prompt(run.tokenizer, QUESTIONS[1], spec.dataset.question_suffix)
    assert scorer.client is sampler
    assert_close(scored.logprobs, await teacher_logprobs(sampler, mine, COMPLETION))


@pytest.mark.parametrize("weights", ["base", "current"])
async def test_a_logit_level_objective_reads_the_self_teacher_after_its_context(tmp_path, weights):
    """The trainer reads the teacher at the completion's positions after the teacher's own
    prompt: its teacher_logprobs are the sampler's (current: the weights that sampled it,
    not the trainer's newer ones) or the base model's scores of context + completion."""
    spec = self_spec({"self": CONTEXT | {"weights": weights}})
    service, run, pool = await opened(spec, tmp_path)
    training = run.training
    sampler = await training.save_weights_and_get_sampling_client_async()
    await (await training.optim_step_async(AdamParams()))  # no gradient: a step count only
    with torch.no_grad():
        for param in training.trainable.values():
            param.add_(torch.randn_like(param) * 0.05)  # the trainer's weights moved on
    item = Item(QUESTIONS[2], ANSWERS[2], pool)
    student_prompt = run.render(item.prompt, pool.options)
    _, [share] = await run.scorer(item, student_prompt, sampler).trained(COMPLETION, [])
    datum = build_opd_datum(
        student_prompt,
        COMPLETION,
        [-1.0] * len(COMPLETION),
        [0.0] * len(COMPLETION),
        weighted=True,
    )

    output = await (
        await training.forward_backward_logits_async(
            [datum], [[share]], ObjectiveSpec(kind="reverse_kl")
        )
    )

    mine = context_prompt(run.tokenizer, QUESTIONS[2], spec.dataset.question_suffix)
    assert share.prompt == mine
    teacher = (
        sampler
        if weights == "current"
        else await service.create_sampling_client_async("tiny-student")
    )
    expected = await teacher_logprobs(teacher, mine, COMPLETION)
    read = output.loss_fn_outputs[0]["teacher_logprobs"].data[-len(COMPLETION) :]
    assert_close(read, expected, rtol=1e-4, what=f"{weights} teacher read by the trainer")
    live = await training.save_weights_and_get_sampling_client_async()
    if weights == "current":
        moved = await teacher_logprobs(live, mine, COMPLETION)
        assert max(abs(a - b) for a, b in zip(read, moved, strict=True)) > 1e-3


async def test_the_trainer_reads_a_teacher_with_its_own_prompt_by_its_datums_shape(tmp_path):
    """A teacher prompt needs the datum's weights 1 on its last positions only."""
    spec = self_spec({"self": CONTEXT})
    _, run, _ = await opened(spec, tmp_path)
    base = await run.training.base_sampling_client_async()
    datum = build_opd_datum([1, 2, 3], [4, 5], [-1.0, -1.0], [0.0, 0.0], weighted=True)
    datum.loss_fn_inputs["weights"].data[-1] = 0.0
    with pytest.raises(ValidationError, match="last positions only"):
        await run.training.forward_backward_logits_async(
            [datum], [[TeacherShare(base, 1.0, [1, 2])]], ObjectiveSpec(kind="reverse_kl")
        )


async def loop(spec: JobSpec, tmp_path: Path) -> RecordingSink:
    sink = RecordingSink()
    await run_loop(
        spec, LocalServiceClient(spec.local, tmp_path), Prompts(QUESTIONS, ANSWERS), sink
    )
    return sink


async def test_without_a_context_a_base_self_teacher_trains_as_the_base_model_beside_it(tmp_path):
    """The same curve as a second copy of the base model as the teacher, step after step
    (the student's LoRA moving away from it); a system line changes what it scores."""
    self_run = await loop(self_spec({"self": {}}), tmp_path / "self")
    copy = await loop(self_spec({"base_model": "tiny-student"}), tmp_path / "copy")
    prompted = await loop(self_spec({"self": {"system": SYSTEM}}), tmp_path / "prompted")

    for step in range(3):
        for key in ("opd/reverse_kl_mean", "trainer/loss_sum"):
            assert_close(self_run.steps[step][key], copy.steps[step][key], what=f"{key} {step}")
    assert (
        abs(prompted.steps[0]["opd/reverse_kl_mean"] - copy.steps[0]["opd/reverse_kl_mean"]) > 1e-3
    )
    assert (
        "info",
        "Teacher self: the student's own model reading a context of its own (its base "
        "weights, the adapter off)",
        {"teacher": "teacher", "mode": "self", "chat_template": "own", "weights": "base"},
    ) in prompted.events


@pytest.mark.parametrize("objective", ["reverse_kl", {"kind": "jsd", "top_k": 16}])
async def test_a_logit_level_objective_with_a_self_teacher_measures_the_sampled_kl_alike(
    tmp_path, objective
):
    """Step 0 samples the same completions under every objective; the trainer's scores of
    them after the teacher's context give the sampled path's reverse KL."""
    teacher = {"self": CONTEXT | {"reference": True}}
    sampled = await loop(
        self_spec(teacher, loop={"steps": 1, "batch_size": 2, "group_size": 2}), tmp_path / "s"
    )
    logit = await loop(
        self_spec(
            teacher, loop={"steps": 1, "batch_size": 2, "group_size": 2, "objective": objective}
        ),
        tmp_path / "l",
    )
    assert_close(
        logit.steps[0]["opd/reverse_kl_mean"], sampled.steps[0]["opd/reverse_kl_mean"], rtol=1e-5
    )
    assert logit.steps[0]["opd/objective_mean"] > 0


def resumable(teacher: dict[str, Any], **loop: Any) -> JobSpec:
    """test_local_state's run, its teacher a self teacher."""
    fields = pipelined(**loop).model_dump()
    fields["teacher"] = teacher
    return JobSpec.model_validate(fields)


@pytest.mark.parametrize(
    ("teacher", "loop"),
    [
        ({"self": CONTEXT | {"weights": "current"}}, {"max_steps_off_policy": 1}),
        ({"self": CONTEXT}, {"max_steps_off_policy": 2, "objective": {"kind": "jsd", "top_k": 16}}),
    ],
    ids=["current-sampled-k1", "base-jsd-k2"],
)
async def test_a_pipelined_run_with_a_self_teacher_resumes_exactly(tmp_path, teacher, loop):
    job = resumable(teacher, steps=6, save_every=3, **loop)
    whole = await run(tmp_path / "whole", job=job)
    kept = {step: path for (step, kind), path in whole.checkpoints.items() if kind == "sampler"}

    resumed = await run(
        tmp_path / "whole", SavedState(whole.checkpoints[3, "state"], 3, kept), job=job
    )

    assert sorted(resumed.metrics) == [3, 4, 5]
    assert_same_training(resumed, whole, 6)


async def test_the_eval_and_its_baseline_read_the_teachers_context(tmp_path):
    """The eval's teacher scores the student's held-out completions after its context, and
    its baseline answers from that context (`current`: with the eval's own sampler)."""
    spec = self_spec(
        {"self": CONTEXT | {"weights": "current"}},
        eval={"holdout": 2, "teacher_baseline": True, "grader": {"regex": "[^\n]*"}},
    )
    _, run, pool = await opened(spec, tmp_path)
    evaluation = evaluation_for(run, [pool], None)
    sampler = await run.training.save_weights_and_get_sampling_client_async()

    answerers = evaluation.answerers(sampler)
    scorers = evaluation.teachers(sampler)

    suffix = spec.dataset.question_suffix
    expected = [context_prompt(run.tokenizer, q, suffix) for q in QUESTIONS]
    assert [a.scorer.prompt for a in answerers] == expected
    assert [s.prompt for s in scorers] == expected
    assert all(a.scorer.client is sampler for a in answerers)
    assert list(evaluation.prompts) == [
        build_prompt(run.tokenizer, q, suffix, False) for q in QUESTIONS
    ]
    metrics = await run.evaluate(evaluation, 0)
    assert {"eval/accuracy", "eval/teacher_accuracy", "eval/reverse_kl_mean"} <= metrics.keys()


async def test_a_self_teacher_over_a_template_without_a_system_role_is_refused(tmp_path):
    folder = tmp_path / "no-system-student"
    tiny_model("tiny-student").save_pretrained(folder)
    tiny_tokenizer(NO_SYSTEM_TEMPLATE).save_pretrained(folder)
    spec = self_spec({"self": CONTEXT}, student={"base_model": str(folder), "lora_rank": 4})
    service = LocalServiceClient(spec.local, tmp_path)
    pools = training_pools(spec, Prompts(QUESTIONS, ANSWERS))

    with pytest.raises(IncompatibleModels, match=r"cannot render teacher\.self.s context: System"):
        await open_run(spec, service, RecordingSink(), None, pools)


async def test_the_student_learns_to_answer_as_the_prompted_teacher_does(tmp_path):
    """A short seeded learning check: without the context the student is its teacher (the
    base model) exactly; with it, their held-out reverse KL starts at about 0.85 nats a
    token and 20 steps take off about half (measured: 0.853 -> 0.410)."""
    held_out = ["What is 9 - 4?", "Compute 6 * 7.", "Is 21 a prime number?", "Solve x + 2 = 5."]
    spec = self_spec(
        {"self": CONTEXT},
        student={"base_model": "tiny-student", "lora_rank": 16, "seed": 42},
        dataset={"source": "inline", "prompts": QUESTIONS + ANSWERS, "question_suffix": ""},
        sampling={"max_tokens": 16},
        optim={"learning_rate": 3e-3},
        loop={"steps": 20, "batch_size": 4, "group_size": 4},
        eval={
            "samples_per_prompt": 4,
            "dataset": {"source": "inline", "prompts": held_out, "question_suffix": ""},
        },
    )
    sink = RecordingSink()
    service = LocalServiceClient(spec.local, tmp_path)
    prompts = Prompts(QUESTIONS + ANSWERS, [None] * 6)
    await run_loop(spec, service, prompts, sink, eval_prompts=Prompts(held_out, [None] * 4))

    before, after = sink.steps[0]["eval/reverse_kl_mean"], sink.evals[20]["eval/reverse_kl_mean"]
    assert before > 0.3, before
    assert after < 0.75 * before, (before, after)
