"""Byte-offset alignment of a student's and a teacher's tokenizations of one text."""

from __future__ import annotations

import math

import pytest
from tokenizers import Tokenizer, decoders, models
from transformers import PreTrainedTokenizerFast

from worker.engine.backends.byte_level import TokenBytes
from worker.engine.backends.local.presets import bpe_tokenizer, tiny_tokenizer
from worker.engine.teachers.alignment import Run, align, chained, spread
from worker.engine.teachers.cross_tokenizer import Tokenizers


def runs_of(alignment) -> list[tuple[list[int], list[int]]]:
    return [(list(run.student), list(run.teacher)) for run in alignment.runs]


def unaligned(alignment) -> list[int]:
    """The indices of the runs that are not the same bytes on both sides."""
    return [index for index, run in enumerate(alignment.runs) if not run.aligned]


def test_the_same_tokenization_aligns_token_for_token() -> None:
    pieces = [b"\\boxed{", b"1", b"5", b"}"]

    alignment = align(pieces, pieces)

    assert runs_of(alignment) == [([0], [0]), ([1], [1]), ([2], [2]), ([3], [3])]
    assert (alignment.aligned_bytes, alignment.total_bytes) == (10, 10)
    student, teacher = [-0.1, -0.2, -0.3, -0.4], [-0.5, -0.6, -0.7, -0.8]
    assert spread(student, teacher, alignment.runs) == pytest.approx(teacher)


def test_disagreeing_tokenizations_align_in_runs_of_the_same_bytes() -> None:
    student = [b"\\", b"b", b"o", b"x", b"e", b"d", b"{", b"1", b"5", b"}"]
    teacher = [b"\\boxed{", b"15", b"}"]

    alignment = align(student, teacher)

    assert runs_of(alignment) == [([0, 1, 2, 3, 4, 5, 6], [0]), ([7, 8], [1]), ([9], [2])]
    assert unaligned(alignment) == []
    assert alignment.aligned_bytes == alignment.total_bytes == 10


def test_boundaries_that_cross_merge_into_one_run() -> None:
    """ab|c against a|bc: no common cut inside, so the run is all three bytes."""
    alignment = align([b"ab", b"c", b"d"], [b"a", b"bc", b"d"])

    assert runs_of(alignment) == [([0, 1], [0, 1]), ([2], [2])]


def test_a_runs_reverse_kl_goes_to_the_student_token_that_closes_it() -> None:
    runs = [Run(range(0, 2), range(0, 1)), Run(range(2, 3), range(1, 3))]
    student, teacher = [-0.5, -1.5, -0.25], [-4.0, -0.5, -0.25]

    mapped = spread(student, teacher, runs)

    kls = [s - t for s, t in zip(student, mapped, strict=True)]
    # Run 1: (-0.5 - 1.5) - (-4) = 2, on its second token; run 2: -0.25 - (-0.75) = 0.5.
    assert kls == pytest.approx([0.0, 2.0, 0.5])
    assert sum(kls) == pytest.approx(sum(student) - sum(teacher))
    assert mapped[0] + mapped[1] == pytest.approx(teacher[0]), "the run keeps the teacher's sum"


def test_runs_joined_by_a_soft_end_share_their_reverse_kl() -> None:
    """The teacher's `5` says the number ends there, which the student's `}` says."""
    runs = [Run(range(0, 1), range(0, 1), soft=True), Run(range(1, 2), range(1, 2))]

    mapped = spread([-1.0, -1.0], [-9.0, -1.0], runs)

    assert [-1.0 - m for m in mapped] == pytest.approx([4.0, 4.0])


def test_the_chain_rule_gives_a_prefix_the_mass_of_the_tokens_it_begins() -> None:
    """Student `1`,`5` against the teacher's `15`: `1` is as likely as every token that
    begins with it (0.9 + 0.05 + 0.01), `5` the rest of `15`'s logprob."""
    ranked = [[(b"15", math.log(0.9)), (b"16", math.log(0.05)), (b"1", math.log(0.01))]]
    alignment = align([b"1", b"5"], [b"15"])

    mapped = chained([b"1", b"5"], [b"15"], alignment, [-0.1, -0.2], [math.log(0.9)], ranked)

    assert mapped == pytest.approx([math.log(0.96), math.log(0.9 / 0.96)])
    assert sum(mapped) == pytest.approx(math.log(0.9))


def test_the_chain_rule_moves_a_tokens_ending_to_the_next_student_token() -> None:
    """Student `1`,`}` against the teacher's `1`,`}` where the teacher expected `15`:
    the start `1` is fine; that the number ends there is what the `}` is blamed for."""
    ranked = [
        [(b"15", math.log(0.98)), (b"1", math.log(0.01)), (b"2", math.log(0.01))],
        [(b"}", 0.0)],
    ]
    alignment = align([b"1", b"}"], [b"1", b"}"], extendable=[True, False])

    mapped = chained(
        [b"1", b"}"], [b"1", b"}"], alignment, [-0.1, -0.1], [math.log(0.01), 0.0], ranked
    )

    assert mapped == pytest.approx([math.log(0.99), math.log(0.01 / 0.99)])


def test_tokens_outside_every_run_get_no_signal() -> None:
    mapped = spread([-0.5, -2.0], [-9.0], [Run(range(0, 1), range(0, 1))])

    assert mapped == pytest.approx([-9.0, -2.0])


def test_multibyte_utf8_split_across_student_tokens_aligns_with_the_whole_character() -> None:
    """A byte-level student emits é as its two bytes; the teacher holds it in one token."""
    student = [b"caf", b"\xc3", b"\xa9", b"!"]
    teacher = [b"ca", b"f\xc3\xa9", b"!"]

    alignment = align(student, teacher)

    assert runs_of(alignment) == [([0, 1, 2], [0, 1]), ([3], [2])]
    assert alignment.aligned_bytes == 6


def test_the_end_of_sequence_tokens_pair_with_each_other() -> None:
    alignment = align([b"1", b"5", b""], [b"15", b""], eos=True)

    assert runs_of(alignment) == [([0, 1], [0]), ([2], [1])]
    assert alignment.total_bytes == 2


def test_a_stray_special_token_is_text_the_teacher_reads() -> None:
    alignment = align([b"a", b"<|im_start|>", b"b"], [b"a<", b"|im", b"_start|>b"])

    assert runs_of(alignment) == [([0, 1, 2], [0, 1, 2])]
    assert alignment.aligned_bytes == alignment.total_bytes


def test_bytes_the_teacher_does_not_reproduce_are_a_run_of_what_it_read_instead() -> None:
    """An invalid byte decodes to U+FFFD, which the teacher reads as three other bytes: the
    teacher's judgement of those stands for the student's byte, which is not aligned."""
    student = [b"12", b" ", b"\xff", b" ", b"34"]
    teacher = [b"12", b" ", b"\xef\xbf\xbd", b" ", b"34"]

    alignment = align(student, teacher)

    assert runs_of(alignment) == [([0], [0]), ([1], [1]), ([2], [2]), ([3], [3]), ([4], [4])]
    assert unaligned(alignment) == [2]
    assert (alignment.aligned_bytes, alignment.total_bytes) == (6, 7)
    student_lp, teacher_lp = [-1.0] * 5, [-1.0, -1.0, -9.0, -1.0, -1.0]
    assert spread(student_lp, teacher_lp, alignment.runs)[2] == -9.0


def test_nothing_in_common_is_one_unaligned_run() -> None:
    alignment = align([b"x", b"y"], [b"ab"])

    assert runs_of(alignment) == [([0, 1], [0])]
    assert unaligned(alignment) == [0]
    assert (alignment.aligned_bytes, alignment.total_bytes) == (0, 2)


def test_bytes_only_the_teacher_has_join_the_next_run() -> None:
    """A tokenizer that normalises "x" to "xx" inserts a byte: no run of its own."""
    alignment = align([b"a", b"x", b"b"], [b"a", b"xx", b"b"])

    assert runs_of(alignment) == [([0], [0]), ([1], [1]), ([2], [2])]
    assert unaligned(alignment) == [1]
    assert (alignment.aligned_bytes, alignment.total_bytes) == (2, 3)


def byte_fallback_tokenizer() -> PreTrainedTokenizerFast:
    """A SentencePiece-like tokenizer: characters, and bytes as <0xNN> where it has no
    character (its decoder is not byte-level, so pieces come from decoded prefixes)."""
    vocab = {"<unk>": 0, "<s>": 1, "a": 2, "b": 3, "c": 4, "<0xC3>": 5, "<0xA9>": 6}
    model = models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True)
    tokenizer = Tokenizer(model)
    tokenizer.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Fuse()])
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>", eos_token="<s>")


def test_a_tokenizer_that_is_not_byte_level_gives_a_characters_bytes_to_its_last_token() -> None:
    tokenizer = byte_fallback_tokenizer()
    ids = [2, 5, 6, 3, 1]

    pieces = TokenBytes(tokenizer).pieces(ids)

    assert pieces == [b"a", b"", b"\xc3\xa9", b"b", b"<s>"]
    alignment = align(pieces[:-1], [b"a\xc3\xa9", b"b"])
    assert runs_of(alignment) == [([0, 1, 2], [0]), ([3], [1])]


def test_a_byte_level_tokenizer_gives_each_token_its_own_bytes() -> None:
    tokenizer = tiny_tokenizer()
    ids = tokenizer.encode("é<|im_end|>", add_special_tokens=False)

    assert TokenBytes(tokenizer).pieces(ids) == [b"\xc3", b"\xa9", b"<|im_end|>"]
    assert TokenBytes(tokenizer).text(ids[:1]) == "\ufffd", "half a character"
    assert TokenBytes(tokenizer).text(ids) == "é<|im_end|>"


def test_the_arithmetic_presets_tokenizers_align_a_whole_answer() -> None:
    student = tiny_tokenizer()
    tokenizers = Tokenizers.of(student, bpe_tokenizer(), ["<|im_end|>"])
    completion = student.encode("\\boxed{15}<|im_end|>", add_special_tokens=False)

    teacher, ended = tokenizers.teacher_tokens(completion)
    alignment = tokenizers.align(completion, teacher, ended)

    assert ended
    assert bpe_tokenizer().convert_ids_to_tokens(teacher) == ["\\boxed{", "15", "}", "<|end|>"]
    assert runs_of(alignment) == [(list(range(7)), [0]), ([7, 8], [1]), ([9], [2]), ([10], [3])]
    assert alignment.aligned_bytes == alignment.total_bytes == 10


def test_a_truncated_completion_has_no_end_of_sequence_to_pair() -> None:
    student = tiny_tokenizer()
    tokenizers = Tokenizers.of(student, bpe_tokenizer())
    completion = student.encode("\\boxed{1", add_special_tokens=False)

    teacher, ended = tokenizers.teacher_tokens(completion)

    assert not ended
    assert bpe_tokenizer().eos_token_id not in teacher
    assert math.isclose(tokenizers.align(completion, teacher, ended).aligned_bytes, 8)
