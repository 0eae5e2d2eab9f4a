"""Byte-offset alignment of two tokenizations of one text, for a teacher with another tokenizer.

The student's completion is a sequence of student tokens; the teacher reads the same text as
its own tokens. Each token covers some bytes of the text. Where a run of student tokens and
a run of teacher tokens cover exactly the same bytes (both sides cut a token there at its
start and at its end, no common cut inside), the two runs are the same text, so their summed
logprobs are the two models' logprobs of that text (`align`).

Inside a run the teacher's split of that sum over the student's finer tokens is not in its
sampled tokens' logprobs. With the teacher's top k at each of its positions it follows from
the chain rule on bytes (`chained`): the teacher's logprob of a text that ends inside one of
its tokens is the mass of its top k that begins with the bytes written so far. Without them
(`spread`), a run's reverse KL goes to the student token that closes it, shared with the
next run where the teacher's token there may be extended (its end is a judgement of what
follows). Either way a run of one token a side is exactly the shared-tokenizer reverse KL,
and the completion's sum is the teacher's own logprob of it.

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
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Run:
    """Student tokens `student` and teacher tokens `teacher` (index ranges) that stand for
    the same stretch of the completion: the same bytes (`aligned`), or bytes the teacher's
    tokenizer reproduced otherwise (the teacher's reading of what the student wrote), or
    the two end-of-sequence tokens."""

    student: range
    teacher: range
    aligned: bool = True
    soft: bool = False
    """Whether its last teacher token is a proper prefix of another of the teacher's tokens
    (`1` of `10`..`19`): by ending there the teacher also says the text does not go on as
    those do, which the student says with its next token, so the next run shares this
    one's reverse KL (`spread`)."""


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


def align(
    student: Sequence[bytes],
    teacher: Sequence[bytes],
    eos: bool = False,
    extendable: Sequence[bool] | None = None,
) -> Alignment:
    """Runs of `student` tokens and `teacher` tokens (each one's bytes) that cover the
    completion: cut wherever both sides end a token inside a stretch of bytes they share
    (`difflib`'s matching blocks), each run aligned if its two sides are the same bytes;
    a run that one side has no token in joins the next (the last, the one before). With
    `eos` both sequences' last token is their end of sequence (no bytes), a run of its own.
    `extendable`: whether each teacher token is a proper prefix of another of its
    vocabulary (`Run.soft`; none if not given)."""
    if extendable is not None:
        plain = align(student, teacher, eos)
        runs = [replace(r, soft=extendable[r.teacher[-1]]) for r in plain.runs[:-1]]
        return replace(plain, runs=[*runs, *plain.runs[-1:]])
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
    """A teacher logprob for each student token, so that each token's reverse KL is its
    share: a run's reverse KL (sum student - sum teacher) goes to its last student token,
    the one that closes it; runs joined by soft ends (`Run.soft`) pool theirs, shared
    evenly by the tokens that close them. Every other token keeps the student's own
    logprob (reverse KL 0)."""
    mapped = [float(v) for v in student_logprobs]
    pooled: list[Run] = []
    for index, run in enumerate(runs):
        pooled.append(run)
        if run.soft and index + 1 < len(runs):
            continue
        kl = sum(
            sum(student_logprobs[i] for i in r.student)
            - sum(teacher_logprobs[j] for j in r.teacher)
            for r in pooled
        )
        for r in pooled:
            last = r.student[-1]
            mapped[last] = float(student_logprobs[last]) - kl / len(pooled)
        pooled = []
    return mapped


Ranked = Sequence[tuple[bytes, float]]
"""The teacher's likeliest tokens at one position, as (their bytes, logprob)."""


def chained(
    student: Sequence[bytes],
    teacher: Sequence[bytes],
    alignment: Alignment,
    student_logprobs: Sequence[float],
    teacher_logprobs: Sequence[float],
    ranked: Sequence[Ranked],
) -> list[float]:
    """A teacher logprob for each student token by the chain rule on bytes, with the
    teacher's top k at each of its positions (`ranked`): the teacher's logprob of the
    text up to a student token's end, less that up to its start. Up to an offset inside
    (or at the end of) a teacher token, that is the tokens before it plus the log of the
    mass of its top k that begin with the bytes it has written so far: the prefix `1` of
    `15` is as likely as every token that begins with `1`, and a token that ends a run
    does not yet say that nothing extends it (the next student token does). In an
    unaligned run the teacher agrees with the student but on its last token; the EOS run
    and the completion's end are the plain sums."""
    s_ends, t_ends = token_ends(student), token_ends(teacher)
    before = [0.0, *itertools.accumulate(teacher_logprobs)]  # teacher tokens before j
    mapped = [float(v) for v in student_logprobs]
    level = 0.0  # the teacher's logprob of the text up to the current student offset
    for run in alignment.runs:
        bytes_in = s_ends[run.student[-1]] - (s_ends[run.student[0]] - len(student[run.student[0]]))
        if not run.aligned or not bytes_in:
            for i in run.student[:-1]:
                level += mapped[i]
            end = before[run.teacher[-1] + 1]
            mapped[run.student[-1]] = end - level
            level = end
            continue
        shift = (s_ends[run.student[0]] - len(student[run.student[0]])) - (
            t_ends[run.teacher[0]] - len(teacher[run.teacher[0]])
        )
        for i in run.student:
            offset = s_ends[i] - shift  # in the teacher's bytes
            if not student[i]:  # a character's leading piece: the next token completes it
                level += mapped[i]
                continue
            k = bisect.bisect_left(t_ends, offset, lo=run.teacher[0], hi=run.teacher[-1] + 1)
            start = t_ends[k] - len(teacher[k])
            written = teacher[k][: offset - start]
            mass = sum(math.exp(lp) for piece, lp in ranked[k] if piece.startswith(written))
            if not any(piece == teacher[k] for piece, _ in ranked[k]):
                mass += math.exp(teacher_logprobs[k])
            now = before[k] + min(math.log(mass), 0.0) if mass > 0 else before[k + 1]
            mapped[i] = now - level
            level = now
    return mapped
