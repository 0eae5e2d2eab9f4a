"""Byte-offset alignment of two tokenizations of one text, for a teacher with another tokenizer.

The student's completion is a sequence of student tokens; the teacher reads the same text as
its own tokens. Each token covers some bytes of the text. Where a run of student tokens and
a run of teacher tokens cover exactly the same bytes (both sides cut a token there at its
start and at its end, no common cut inside), the two runs are the same text, so their summed
logprobs are the two models' logprobs of that text, and the run's reverse KL is
`sum(student) - sum(teacher)`. Inside a run only that sum is known: how the teacher would
split it over the student's finer tokens needs its whole distribution. The whole run's
reverse KL goes to the run's last student token, the one that closes it (`spread`): the
cumulative reverse KL of the completion is then exact at every common cut, and a run of one
token each is exactly the per-token reverse KL of a shared tokenizer.

Every token of both sides is in some run, so no part of the completion escapes the teacher
(a student learns to write what nobody judges if that costs nothing): bytes the teacher's
tokenizer does not reproduce (text it normalises, invalid UTF-8 that decoding replaced) form
a run of what the student wrote against what the teacher read instead, not counted as
aligned; special and added tokens are their literal text; the end-of-sequence tokens of the
two sides pair with each other when both completions end with one. The two byte strings are
matched first (`difflib`), so one unreproducible character costs its own run only.
"""

from __future__ import annotations

import bisect
import difflib
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character table, which `ByteLevel` applies."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    table = {byte: chr(byte) for byte in printable}
    extra = 0
    for byte in range(256):
        if byte not in table:
            table[byte] = chr(256 + extra)
            extra += 1
    return table


BYTE_OF = {char: byte for byte, char in bytes_to_unicode().items()}
"""GPT-2's byte-level characters back to the bytes they stand for."""


@dataclass(frozen=True)
class Run:
    """Student tokens `student` and teacher tokens `teacher` (index ranges) that stand for
    the same stretch of the completion: the same bytes (`aligned`), or bytes the teacher's
    tokenizer reproduced otherwise (the teacher's reading of what the student wrote), or
    the two end-of-sequence tokens."""

    student: range
    teacher: range
    aligned: bool = True


@dataclass(frozen=True)
class Alignment:
    """The runs of a completion, which cover every token of both sides, and how many of
    the completion's bytes the aligned ones cover."""

    runs: list[Run]
    aligned_bytes: int
    total_bytes: int


def token_ends(pieces: Sequence[bytes]) -> list[int]:
    """Each token's end offset in the joined bytes."""
    return list(itertools.accumulate(len(piece) for piece in pieces))


def align(student: Sequence[bytes], teacher: Sequence[bytes], eos: bool = False) -> Alignment:
    """Runs of `student` tokens and `teacher` tokens (each one's bytes) that cover the
    completion: cut wherever both sides end a token inside a stretch of bytes they share
    (`difflib`'s matching blocks), each run aligned if its two sides are the same bytes;
    a run that one side has no token in joins the next (the last, the one before). With
    `eos` both sequences' last token is their end of sequence (no bytes), a run of its own."""
    if eos:
        body = align(student[:-1], teacher[:-1])
        last = Run(range(len(student) - 1, len(student)), range(len(teacher) - 1, len(teacher)))
        return Alignment([*body.runs, last], body.aligned_bytes, body.total_bytes)
    ours, theirs = b"".join(student), b"".join(teacher)
    s_ends, t_ends = token_ends(student), token_ends(teacher)
    s_cuts, t_cuts = {0, *s_ends}, {0, *t_ends}
    cuts = [(0, 0)]
    for block in difflib.SequenceMatcher(None, ours, theirs, autojunk=False).get_matching_blocks():
        shift = block.a - block.b
        cuts += [
            (cut, cut - shift)
            for cut in sorted(s_cuts)
            if block.a <= cut <= block.a + block.size and cut - shift in t_cuts
        ]
    cuts.append((len(ours), len(theirs)))
    cuts = sorted(set(cuts))
    s_groups = grouped(s_ends, student, [x for x, _ in cuts])
    t_groups = grouped(t_ends, teacher, [y for _, y in cuts])
    runs: list[Run] = []
    sizes: list[int] = []
    mine: list[int] = []
    yours: list[int] = []
    for index, ((x1, y1), (x2, y2)) in enumerate(itertools.pairwise(cuts)):
        fresh = not mine and not yours
        mine, yours = mine + s_groups[index], yours + t_groups[index]
        if mine and yours:
            same = fresh and ours[x1:x2] == theirs[y1:y2]
            runs.append(Run(span(mine), span(yours), same))
            sizes.append(x2 - x1 if same else 0)
            mine, yours = [], []
    if (mine or yours) and runs:  # tokens after the last run's: they join it
        last = runs.pop()
        runs.append(Run(span([*last.student, *mine]), span([*last.teacher, *yours]), False))
        sizes[-1] = 0
    return Alignment(runs, sum(sizes), len(ours))


def span(indices: Sequence[int]) -> range:
    return range(indices[0], indices[-1] + 1)


def grouped(ends: list[int], pieces: Sequence[bytes], cuts: list[int]) -> list[list[int]]:
    """The tokens between each two consecutive cuts (offsets of this side): a token goes
    with the stretch its first byte is in (a zero-byte one with the byte after it), and
    those after the last byte with the last stretch."""
    groups: list[list[int]] = [[] for _ in range(max(len(cuts) - 1, 1))]
    for index, (end, piece) in enumerate(zip(ends, pieces, strict=True)):
        start = end - len(piece)
        stretch = bisect.bisect_right(cuts, start) - 1
        groups[min(stretch, len(groups) - 1)].append(index)
    return groups


def spread(
    student_logprobs: Sequence[float], teacher_logprobs: Sequence[float], runs: Sequence[Run]
) -> list[float]:
    """A teacher logprob for each student token: a run's whole reverse KL (sum student -
    sum teacher) on its last student token, the one that closes it, whose teacher logprob
    is the run's sum minus what the student gave the others; every other token keeps the
    student's own (reverse KL 0, no signal)."""
    mapped = [float(v) for v in student_logprobs]
    for run in runs:
        last = run.student[-1]
        inner = sum(student_logprobs[i] for i in run.student[:-1])
        mapped[last] = sum(teacher_logprobs[j] for j in run.teacher) - inner
    return mapped


class TokenBytes:
    """A tokenizer's tokens as the bytes of text they stand for. Added and special tokens
    are their literal text (so a student's stray `<|im_start|>` is text the teacher reads
    and judges). A byte-level BPE's other tokens are read from its vocabulary (exact, a
    partial UTF-8 character included); any other tokenizer's from the text each decoded
    prefix adds (a token that ends inside a character gets no bytes; the one that
    completes it, the character's)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.added = {index: token.encode() for token, index in tokenizer.get_added_vocab().items()}
        plain = {t: i for t, i in tokenizer.get_vocab().items() if i not in self.added}
        decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
        self.byte_level = type(decoder).__name__ == "ByteLevel" and all(
            char in BYTE_OF for token in plain for char in token
        )
        self.by_id: dict[int, bytes] = {}
        if self.byte_level:
            self.by_id = {i: bytes(BYTE_OF[char] for char in t) for t, i in plain.items()}
            self.by_id |= self.added

    def pieces(self, ids: Sequence[int]) -> list[bytes]:
        if self.byte_level:
            return [self.by_id[i] for i in ids]
        pieces: list[bytes] = []
        segment: list[int] = []  # plain tokens since the last added one
        done = b""
        for index in ids:
            if index in self.added:
                pieces.append(self.added[index])
                segment, done = [], b""
                continue
            segment.append(index)
            text = self.tokenizer.decode(segment, clean_up_tokenization_spaces=False)
            now = text.encode()
            if text.endswith("\ufffd") or not now.startswith(done):
                pieces.append(b"")  # inside a character: a later token completes it
                continue
            pieces.append(now[len(done) :])
            done = now
        return pieces

    def text(self, ids: Sequence[int]) -> str:
        """The text of `ids`, as the other side reads it."""
        return b"".join(self.pieces(ids)).decode("utf-8", errors="replace")
