"""The local backend with `arith-teacher-bpe`, a teacher over another tokenizer (a BPE with
other special tokens and another chat template): its scoring of the student's completions,
mapped onto the student's tokens, keeps the teacher's own logprob of every aligned run; the
preflight names its mode and the probe's alignment; a short job logs the aligned fraction;
and a logit-level objective reads a folder's teacher over the next byte
(test_local_next_byte.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernel.model_names import ARITH_STUDENT, ARITH_TEACHER, ARITH_TEACHER_BPE
from kernel.spec import ArithmeticDataset, JobSpec, LocalBackendSpec
from tests.fakes.sinks import RecordingSink
from tests.support import assert_close
from worker.engine.backends.local import LocalServiceClient
from worker.engine.backends.local.presets import preset_tokenizer
from worker.engine.backends.local.trained import trained_model
from worker.engine.data.prompts import Prompts, build_prompt
from worker.engine.loop.steps import run_loop
from worker.engine.rollouts.sampling import stop_sequences
from worker.engine.teachers.cross_tokenizer import CROSS_TOP_K, Retokenized, Tokenizers
from worker.engine.teachers.preflight import teacher_mode
from worker.engine.teachers.scoring import Prompted, teacher_logprobs

SUFFIX = ArithmeticDataset().question_suffix
QUESTIONS = ["What is 2 + 3?", "What is 7 * 8?"]
COMPLETIONS = [
    "\\boxed{5}<|im_end|>",  # right, ends with the student's EOS
    "\\boxed{56}<|im_end|>",  # a two-digit answer: one teacher token, two student bytes
    "\\boxed{57",  # truncated: no EOS to pair
    "\\boxed{é}<|im_end|>",  # a character of two bytes, two student tokens
]


@pytest.fixture
def service(tmp_path: Path) -> LocalServiceClient:
    return LocalServiceClient(LocalBackendSpec(device="cpu"), tmp_path)


def spec_with(teacher: str, **loop: object) -> JobSpec:
    return JobSpec.model_validate(
        {
            "backend": "local",
            "local": {"device": "cpu"},
            "student": {"base_model": ARITH_STUDENT, "lora_rank": 4},
            "teacher": {"base_model": teacher},
            "dataset": {"source": "inline", "prompts": QUESTIONS},
            "sampling": {"max_tokens": 12},
            "loop": {"steps": 2, "batch_size": 2, "group_size": 2, **loop},
        }
    )


@pytest.mark.parametrize("top_k", [0, CROSS_TOP_K])
async def test_the_mapped_logprobs_keep_the_teachers_own_sums(service, top_k: int) -> None:
    """At the end of every run that nothing in the teacher's vocabulary extends (and so at
    the completion's end), the student tokens' mapped logprobs add up to the teacher's own
    logprob of its own tokens of the same text, with the sampled logprobs alone (top_k 0)
    and with the chain rule over the teacher's top k."""
    teacher = await service.create_sampling_client_async(ARITH_TEACHER_BPE)
    theirs, students = teacher.get_tokenizer(), preset_tokenizer(ARITH_STUDENT)
    tokenizers = Tokenizers.of(students, theirs, stop_sequences(students), top_k)
    prompt = build_prompt(theirs, QUESTIONS[1], SUFFIX, False)
    scorer = Retokenized("teacher", teacher, prompt, tokenizers)
    for text in COMPLETIONS:
        completion = students.encode(text, add_special_tokens=False)
        student_logprobs = [-0.05 * (i + 1) for i in range(len(completion))]

        scored = await scorer.score(completion, student_logprobs)

        # The teacher's own scoring of its own tokens of the same text.
        ended = text.endswith("<|im_end|>")
        body = theirs.encode(text.removesuffix("<|im_end|>"), add_special_tokens=False)
        own = [*body, theirs.eos_token_id] if ended else body
        direct = await teacher_logprobs(teacher, prompt, own)
        alignment = tokenizers.align(completion, own, ended)
        firm = [run for run in alignment.runs if not run.soft]
        assert firm and firm[-1] == alignment.runs[-1], text
        for run in firm:
            mapped = sum(scored.logprobs[: run.student[-1] + 1])
            assert mapped == pytest.approx(sum(direct[: run.teacher[-1] + 1]), abs=1e-4), text
        assert scored.teacher_tokens == {"teacher": len(prompt) + len(own)}
        assert scored.aligned_bytes == {"teacher": (alignment.aligned_bytes, alignment.total_bytes)}
        every_byte = len(text.removesuffix("<|im_end|>").encode())
        assert alignment.aligned_bytes == alignment.total_bytes == every_byte


async def test_the_chain_rule_blames_the_token_that_goes_wrong(service) -> None:
    """Asked 7 * 8 (56): the student's `5` is a good start (the teacher's mass on tokens
    that begin with 5), and closing after it (`5}`) or going on with `7` is what is wrong;
    the sampled logprobs alone cannot tell the start from the close."""
    teacher = await service.create_sampling_client_async(ARITH_TEACHER_BPE)
    students = preset_tokenizer(ARITH_STUDENT)
    tokenizers = Tokenizers.of(
        students, teacher.get_tokenizer(), stop_sequences(students), CROSS_TOP_K
    )
    prompt = build_prompt(teacher.get_tokenizer(), QUESTIONS[1], SUFFIX, False)
    scorer = Retokenized("teacher", teacher, prompt, tokenizers)
    at = len("\\boxed{")
    for text in ("\\boxed{5}<|im_end|>", "\\boxed{57}<|im_end|>"):
        completion = students.encode(text, add_special_tokens=False)
        scored = await scorer.score(completion, [0.0] * len(completion))

        assert scored.logprobs[at] > -0.5, (text, "the first digit is right")
        assert scored.logprobs[at + 1] < -3.0, (text, "what follows it is wrong")


async def test_the_top_k_holds_the_prefix_mass_of_a_wrong_first_digit(service) -> None:
    """Asked 1 + 2 (3), the student's `4` is judged by the teacher's mass on every token
    that begins with `4` (`4`, `40`..`49`), which its whole distribution gives: the top k
    read hold it, so the `}` after the lone `4` is blamed for the number it ends (a top 20
    left `40`..`49` out, gave the digit the whole blame and the `}` none)."""
    teacher = await service.create_sampling_client_async(ARITH_TEACHER_BPE)
    theirs, students = teacher.get_tokenizer(), preset_tokenizer(ARITH_STUDENT)
    prompt = build_prompt(theirs, "What is 1 + 2?", SUFFIX, False)
    completion = students.encode("\\boxed{4}<|im_end|>", add_special_tokens=False)
    scored = {}
    for k in (CROSS_TOP_K, len(theirs)):  # the whole vocabulary: the exact chain rule
        tokenizers = Tokenizers.of(students, theirs, stop_sequences(students), k)
        scorer = Retokenized("teacher", teacher, prompt, tokenizers)
        scored[k] = (await scorer.score(completion, [0.0] * len(completion))).logprobs

    at = len("\\boxed{")
    # Within 5% (what lies past the top k is small); a top 20 is off by a quarter.
    assert_close(scored[CROSS_TOP_K], scored[len(theirs)], rtol=0.05)
    assert scored[CROSS_TOP_K][at + 1] < -1.0, "the number that goes on after 4 is blamed"
    assert scored[CROSS_TOP_K][at] < -3.0, "4 is a wrong start"


async def test_a_tokenizer_that_spells_alike_scores_exactly_as_the_shared_one(service) -> None:
    """Cross-tokenizer scoring through a tokenizer with one more token, which spells every
    answer with the student's ids, gives each token the logprob the shared tokenizer does."""
    teacher = await service.create_sampling_client_async(ARITH_TEACHER)
    students = preset_tokenizer(ARITH_STUDENT)
    other = preset_tokenizer(ARITH_STUDENT)
    other.add_tokens(["<extra>"])
    tokenizers = Tokenizers.of(students, other, stop_sequences(students))
    prompt = build_prompt(students, QUESTIONS[1], SUFFIX, False)
    for answer in ("56", "57", "6"):
        completion = students.encode(f"\\boxed{{{answer}}}<|im_end|>", add_special_tokens=False)
        student_logprobs = [-0.5] * len(completion)

        crossed = await Retokenized("t", teacher, prompt, tokenizers).score(
            completion, student_logprobs
        )
        shared = await Prompted("t", teacher, prompt).score(completion, student_logprobs)

        assert crossed.logprobs == pytest.approx(shared.logprobs, abs=1e-6), answer
        assert crossed.teacher_tokens == shared.teacher_tokens


async def test_a_right_answer_is_likelier_than_a_wrong_one_through_the_alignment(service):
    """The mapping carries the teacher's judgement: the student's bytes of the right answer
    get a far higher summed teacher logprob than those of a wrong one."""
    teacher = await service.create_sampling_client_async(ARITH_TEACHER_BPE)
    students = preset_tokenizer(ARITH_STUDENT)
    tokenizers = Tokenizers.of(students, teacher.get_tokenizer(), stop_sequences(students))
    prompt = build_prompt(teacher.get_tokenizer(), QUESTIONS[1], SUFFIX, False)
    scorer = Retokenized("teacher", teacher, prompt, tokenizers)
    sums = {}
    for answer in ("56", "57"):
        completion = students.encode(f"\\boxed{{{answer}}}<|im_end|>", add_special_tokens=False)
        scored = await scorer.score(completion, [0.0] * len(completion))
        sums[answer] = sum(scored.logprobs)

    assert sums["56"] > -1.0
    assert sums["56"] > sums["57"] + 5.0, sums


def test_the_preflight_tells_the_three_modes_apart() -> None:
    students = preset_tokenizer(ARITH_STUDENT)
    checked = [(QUESTIONS[0], ArithmeticDataset())]

    assert teacher_mode(students, preset_tokenizer(ARITH_TEACHER), checked) == "same"
    assert teacher_mode(students, preset_tokenizer("arith-teacher-template"), checked) == "own"
    assert teacher_mode(students, preset_tokenizer(ARITH_TEACHER_BPE), checked) == "cross"


async def test_a_short_job_names_the_mode_and_logs_the_aligned_fraction(service) -> None:
    spec = spec_with(ARITH_TEACHER_BPE)
    sink = RecordingSink()

    await run_loop(spec, service, Prompts(QUESTIONS, ["5", "56"]), sink)

    [(level, message, data)] = [e for e in sink.events if e[2] and e[2].get("mode")]
    assert level == "info"
    assert message.startswith("Teacher 'arith-teacher-bpe': another tokenizer")
    assert "of the probe batch's completion bytes aligned" in message
    assert data["mode"] == "cross" and data["teacher"] == "teacher"
    assert 0.9 <= data["aligned_bytes_fraction"] <= 1.0
    assert len(sink.steps) == 2
    for metrics in sink.steps.values():
        assert 0.9 <= metrics["opd/aligned_bytes_fraction"] <= 1.0
        # The teacher reads its own BPE tokens: fewer than the student's bytes.
        assert 0 < metrics["usage/teacher_tokens"] < metrics["usage/trained_tokens"]


async def test_the_same_tokenizer_logs_no_aligned_fraction(service) -> None:
    sink = RecordingSink()

    await run_loop(spec_with(ARITH_TEACHER), service, Prompts(QUESTIONS, ["5", "56"]), sink)

    assert all("opd/aligned_bytes_fraction" not in m for m in sink.steps.values())


async def test_a_logit_objective_with_a_cross_tokenizer_folder_trains_over_the_next_byte(
    service, tmp_path: Path
) -> None:
    """A folder's tokenizer is visible only to the worker: its preflight finds another
    tokenizer, and the trainer compares the two models over the next byte."""
    folder = tmp_path / "bpe-teacher"
    trained_model(ARITH_TEACHER_BPE).save_pretrained(folder)
    preset_tokenizer(ARITH_TEACHER_BPE).save_pretrained(folder)
    spec = spec_with(str(folder), objective="jsd")
    sink = RecordingSink()

    await run_loop(spec, service, Prompts(QUESTIONS, ["5", "56"]), sink)

    assert sorted(sink.steps) == [0, 1]
    assert all(m["opd/objective_mean"] > 0 for m in sink.steps.values())
    assert any("another tokenizer" in message for _, message, _ in sink.events)
