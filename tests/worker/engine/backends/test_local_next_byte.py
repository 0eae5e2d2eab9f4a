"""A logit-level objective across tokenizers (local backend): both models' next-token
distributions as distributions over the text's next byte (`next_byte.py`), the teacher read
at its own tokens (`Tokenizers.view`); exact where the two tokenizers are one, and a short
job trains with a teacher of another tokenizer."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from pytrio.types import AdamParams, ModelInput, SamplingParams

from kernel.model_names import ARITH_STUDENT, ARITH_TEACHER, ARITH_TEACHER_BPE
from kernel.spec import JobSpec, LocalBackendSpec, ObjectiveSpec
from tests.fakes.sinks import RecordingSink
from tests.support import assert_close
from worker.engine.backends.contract import ByteView, TeacherShare
from worker.engine.backends.local import LocalServiceClient
from worker.engine.backends.local.next_byte import (
    END,
    REST,
    ByteClasses,
    student_classes,
    teacher_classes,
)
from worker.engine.backends.local.presets import preset_tokenizer
from worker.engine.data.datasets import load_datasets
from worker.engine.data.prompts import build_prompt
from worker.engine.loop.steps import run_loop
from worker.engine.rollouts.datums import build_opd_datum
from worker.engine.rollouts.sampling import stop_sequences
from worker.engine.teachers.cross_tokenizer import Retokenized, Tokenizers

PIECES = [b"5", b"56", b"57", b"}", b"6", b"", b"x"]
"""A teacher's tokens: `5`, two numbers it extends to, `}`, `6`, an end of sequence, `x`."""


def test_a_prefix_inside_a_token_gives_the_bytes_that_follow_it_and_the_tokens_end():
    classes = ByteClasses(PIECES, ends={5})
    logprobs = torch.tensor([[0.1, 0.3, 0.2, 0.15, 0.05, 0.1, 0.1]]).log()

    at_start, kept_all = teacher_classes(classes, logprobs, [b""])
    inside, kept = teacher_classes(classes, logprobs, [b"5"])

    assert_close(at_start[0, ord("5")].exp().item(), 0.6)  # 5, 56, 57
    assert_close(at_start[0, END].exp().item(), 0.1)
    assert bool(kept_all.all())
    # After `5` inside the teacher's `56`: 6 (56), 7 (57), or its `5` ends there (REST).
    assert_close(inside[0, ord("6")].exp().item(), 0.3 / 0.6)
    assert_close(inside[0, ord("7")].exp().item(), 0.2 / 0.6)
    assert_close(inside[0, REST].exp().item(), 0.1 / 0.6)
    assert kept[0].nonzero().flatten().tolist() == [ord("6"), ord("7"), REST]


def test_right_after_a_token_others_go_on_from_the_text_may_still_go_on_as_they_do():
    """After the teacher's `5` (where `56` and `57` are tokens too) its next token was
    predicted knowing the number had ended; one position earlier it gave `56` and `57`
    their mass, which the next byte keeps."""
    classes = ByteClasses(PIECES, ends={5})
    before = torch.tensor([[0.5, 0.3, 0.2, 1e-9, 1e-9, 1e-9, 1e-9]]).log()
    now = torch.tensor([[1e-9, 1e-9, 1e-9, 0.9, 1e-9, 0.1, 1e-9]]).log()

    alone, _ = teacher_classes(classes, now, [b""])
    joined, kept = teacher_classes(classes, now, [b""], before, [b"5"])

    assert_close(alone[0, ord("}")].exp().item(), 0.9, rtol=1e-4)
    expected = {ord("6"): 0.3, ord("7"): 0.2, ord("}"): 0.45, END: 0.05}
    for byte, mass in expected.items():
        assert_close(joined[0, byte].exp().item(), mass, rtol=1e-4)
    assert bool(kept.all())
    # After a token nothing goes on from (`}`), the next token says it all.
    unchanged, _ = teacher_classes(classes, now, [b""], before, [b"}"])
    assert_close(unchanged, alone)


def test_the_students_bytes_a_teachers_token_does_not_go_on_with_are_the_rest():
    student = ByteClasses([b"6", b"7", b"}", b"", b"6x"], ends={3})
    logprobs = torch.tensor([[0.2, 0.1, 0.4, 0.2, 0.1]], requires_grad=True)
    kept = torch.zeros(1, 258, dtype=torch.bool)
    kept[0, [ord("6"), ord("7"), REST]] = True

    ours = student_classes(student, logprobs.log_softmax(-1), kept)

    probs = logprobs.softmax(-1)[0]
    assert_close(ours[0, ord("6")].exp().item(), (probs[0] + probs[4]).item())
    assert_close(ours[0, REST].exp().item(), (probs[2] + probs[3]).item())  # `}` and the end
    assert_close(ours[0].exp().sum().item(), 1.0)
    ours[0, REST].backward()
    assert logprobs.grad is not None and bool(logprobs.grad.abs().sum() > 0)


def test_a_view_places_each_student_byte_in_the_teachers_tokens():
    student, teacher = preset_tokenizer(ARITH_STUDENT), preset_tokenizer(ARITH_TEACHER_BPE)
    tokenizers = Tokenizers.of(student, teacher, stop_sequences(student))
    completion = student.encode("\\boxed{56}<|im_end|>", add_special_tokens=False)

    view = tokenizers.view(completion, [-1.0] * len(completion))

    assert [teacher.decode([t]) for t in view.tokens] == ["\\boxed{", "56", "}", "<|end|>"]
    assert list(view.positions) == [0] * 7 + [1, 1, 2, 3]
    assert list(view.written[6:]) == [b"\\boxed", b"", b"5", b"", b""]


async def share_view(teacher: Any, completion: list[int], prompt: list[int]) -> ByteView:
    """A byte-level teacher of the student's own tokens, read as one of another tokenizer:
    each token a teacher token of its own, nothing written before it, its logprob the
    teacher's own."""
    logprobs = await teacher.compute_logprobs_async(ModelInput.from_ints(prompt + completion))
    mapped = [float(v) for v in logprobs[len(prompt) :]]
    return ByteView(completion, list(range(len(completion))), [b""] * len(completion), mapped)


@pytest.mark.parametrize("kind", ["reverse_kl", "jsd"])
async def test_over_one_byte_level_vocabulary_the_next_byte_is_the_next_token(tmp_path, kind):
    """With a teacher of the student's byte-level tokenizer, the next-byte objective is the
    token objective exactly (every token is one byte, its end of sequence the end), and so
    are its gradients."""
    service = LocalServiceClient(LocalBackendSpec(device="cpu"), tmp_path)
    tokenizer = preset_tokenizer(ARITH_STUDENT)
    prompt = build_prompt(tokenizer, "What is 7 * 8?", "Answer in \\boxed{}.", False)
    completion = [*tokenizer.encode("\\boxed{56}", add_special_tokens=False), 258]
    datum = build_opd_datum(
        prompt, completion, [-1.0] * len(completion), [0.0] * len(completion), weighted=True
    )
    objective = ObjectiveSpec(kind=kind)
    results = []
    for across in (False, True):
        training = await service.create_lora_training_client_async(ARITH_STUDENT, 4, seed=1)
        teacher = await service.create_sampling_client_async(ARITH_TEACHER)
        view = await share_view(teacher, completion, prompt) if across else None
        share = TeacherShare(teacher, 1.0, prompt, view)
        output = await (await training.forward_backward_logits_async([datum], [[share]], objective))
        grads = [p.grad.clone() for p in training.trainable.values() if p.grad is not None]
        await (await training.optim_step_async(AdamParams()))
        results.append((output.metrics["objective_mean"], grads))
    (token_value, token_grads), (byte_value, byte_grads) = results
    assert token_value > 0.01
    assert_close(byte_value, token_value, rtol=1e-4)
    assert len(byte_grads) == len(token_grads) > 0
    for ours, theirs in zip(byte_grads, token_grads, strict=True):
        assert_close(ours, theirs, rtol=1e-3)


async def test_the_bytes_after_a_tokens_first_are_judged_by_the_sampled_token(tmp_path):
    """A BPE student (`arith-teacher-bpe`'s model and tokens), asked 7 * 8, answers with its
    token `56`; its teacher (byte-level `arith-teacher`) reads 2 + 3 instead, so it expects
    `5` and then the end of the number. Over the next byte alone `56` is as right as `5`
    (both begin with the byte 5); the sampled token's share of the reverse KL (its bytes by
    the chain rule) is what makes a step move the student from `56` to `5`."""
    service = LocalServiceClient(LocalBackendSpec(device="cpu"), tmp_path)
    training = await service.create_lora_training_client_async(ARITH_TEACHER_BPE, 8, seed=1)
    teacher = await service.create_sampling_client_async(ARITH_TEACHER)
    ours, theirs = preset_tokenizer(ARITH_TEACHER_BPE), preset_tokenizer(ARITH_TEACHER)
    suffix = "Answer in \\boxed{}."
    prompt = build_prompt(ours, "What is 7 * 8?", suffix, False)
    completion = [*ours.encode("\\boxed{56}", add_special_tokens=False), ours.eos_token_id]
    five, fifty_six = ours.encode("5", add_special_tokens=False)[0], completion[1]
    tokenizers = Tokenizers.of(ours, theirs, stop_sequences(ours), 100)
    teacher_prompt = build_prompt(theirs, "What is 2 + 3?", suffix, False)
    scored = await Retokenized("teacher", teacher, teacher_prompt, tokenizers).score(
        completion, [-1.0] * len(completion)
    )
    assert scored.logprobs[1] < -5  # the teacher: 56 is wrong
    datum = build_opd_datum(
        prompt, completion, [-1.0] * len(completion), [0.0] * len(completion), weighted=True
    )
    share = TeacherShare(teacher, 1.0, teacher_prompt, tokenizers.view(completion, scored.logprobs))

    async def odds() -> float:
        """log p(56) - log p(5) where the student answers."""
        sampler = await training.save_weights_and_get_sampling_client_async()
        response = await sampler.sample_async(
            ModelInput.from_ints(prompt + completion[:2]),
            num_samples=1,
            sampling_params=SamplingParams(max_tokens=1),
            include_prompt_logprobs=True,
            topk_prompt_logprobs=len(ours),
        )
        ranked = dict(response.topk_prompt_logprobs[-1])
        return ranked[fifty_six] - ranked[five]

    before = await odds()
    output = await (
        await training.forward_backward_logits_async([datum], [[share]], ObjectiveSpec(kind="jsd"))
    )
    await (await training.optim_step_async(AdamParams(learning_rate=0.01)))

    assert before > 5 and output.metrics["objective_mean"] >= 0
    assert await odds() < before - 5


def cross_job(**loop: object) -> JobSpec:
    return JobSpec.model_validate(
        {
            "backend": "local",
            "local": {"device": "cpu"},
            "student": {"base_model": ARITH_STUDENT, "lora_rank": 4, "seed": 2},
            "teacher": {"base_model": ARITH_TEACHER_BPE},
            "dataset": {"source": "arithmetic", "count": 150},
            "sampling": {"max_tokens": 12},
            "loop": {"steps": 2, "batch_size": 2, "group_size": 2, "objective": "jsd"} | loop,
        }
    )


async def test_a_job_trains_a_logit_level_objective_with_a_teacher_of_another_tokenizer(
    tmp_path: Path,
):
    spec = cross_job()
    sink = RecordingSink()

    await run_loop(
        spec, LocalServiceClient(spec.local, tmp_path), load_datasets(spec, tmp_path, False), sink
    )

    for step in (0, 1):
        metrics = sink.steps[step]
        assert math.isfinite(metrics["opd/objective_mean"]) and metrics["opd/objective_mean"] > 0
        # The sampled reverse KL is the chain rule's, as under sampled_reverse_kl.
        assert 0 < metrics["opd/aligned_bytes_fraction"] <= 1
        assert math.isfinite(metrics["opd/reverse_kl_mean"])


def test_a_mixture_with_a_teacher_of_another_tokenizer_is_refused_under_a_logit_objective():
    with pytest.raises(ValueError, match="a mixture of teachers cannot share"):
        JobSpec.model_validate(
            cross_job().model_dump()
            | {
                "teacher": None,
                "teachers": {
                    "bpe": {"base_model": ARITH_TEACHER_BPE},
                    "bytes": {"base_model": ARITH_TEACHER},
                },
                "teacher_mixture": "mixture",
            }
        )
