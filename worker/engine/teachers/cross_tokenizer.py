"""A teacher with another tokenizer: it reads the completion's text as its own tokens.

The student's completion tokens become text (their bytes, `byte_level.TokenBytes`); the
teacher tokenizes that text with its own tokenizer after its own rendering of the question,
and its end-of-sequence token after it when the student's completion ended with its own. The
teacher scores `teacher_prompt + teacher_completion` in one prefill: with its top k at each
position where its client gives them (a backend's sampler; a teacher server under
`protocol: prompt_logprobs`, `teachers.served_top_k`), else with `compute_logprobs_async`
alone (a teacher server under `echo`). `alignment` maps its logprobs onto the student's
tokens by byte offsets (the chain rule over the top k, else the sampled logprobs' runs).
The datum keeps the student's tokens, so everything after scoring is unchanged. Under a
logit-level objective the local trainer also reads the teacher's whole distribution at each
position, as the next byte's (`Tokenizers.view`, `backends/local/next_byte.py`).
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from worker.engine.backends.byte_level import TokenBytes
from worker.engine.backends.contract import ByteView, SamplingClient, TeacherShare
from worker.engine.rollouts.sampling import Scored
from worker.engine.teachers.alignment import Alignment, align, chained, spread
from worker.engine.teachers.scoring import teacher_logprobs, teacher_prefill

CROSS_TOP_K = 100
"""The teacher's likeliest tokens read at each position where its client can give them
(`sample_async` with top-k prompt logprobs, as PyTRIO's, Tinker's and the local sampler
can): the prefix masses of the chain rule on bytes. A wrong first digit's mass lies in
tokens a top 20 leaves out (`4` and `40`..`49` when the answer is 3), which then put the
whole number's blame on the digit and none on the `}` after it; with the top 100 the
demo's student learned faster early (27% against 16% held out at step 50;
docs/concepts/teachers.md)."""


def top_k_of(client: Any) -> int:
    """CROSS_TOP_K for a backend's client that samples (so it can give its top k), else 0:
    one with compute_logprobs_async alone maps its sampled logprobs (a teacher server's
    top k depend on its protocol: `teachers.served_top_k`)."""
    return CROSS_TOP_K if callable(getattr(client, "sample_async", None)) else 0


@dataclass(frozen=True)
class Tokenizers:
    """The student's and a teacher's tokenizers, as bytes, and their end-of-sequence ids."""

    student: TokenBytes
    teacher: TokenBytes
    student_eos: frozenset[int]
    teacher_eos: int
    top_k: int = 0
    """The teacher's likeliest tokens read at each position for the chain rule on bytes
    (`alignment.chained`); 0: its sampled tokens' logprobs only (`alignment.spread`)."""

    @classmethod
    def of(
        cls, student: Any, teacher: Any, stops: Sequence[str] = (), top_k: int = 0
    ) -> Tokenizers:
        """`stops`: the student's stop strings that are tokens of its own (each ends a
        completion as its EOS does)."""
        vocab = student.get_vocab()
        eos = {student.eos_token_id, *(vocab[s] for s in stops if s in vocab)}
        return cls(
            TokenBytes(student),
            TokenBytes(teacher),
            frozenset(i for i in eos if i is not None),
            teacher.eos_token_id,
            top_k,
        )

    def teacher_tokens(self, completion: Sequence[int]) -> tuple[list[int], bool]:
        """The completion as the teacher's tokens, and whether both end with their EOS."""
        ended = bool(completion) and completion[-1] in self.student_eos
        body = completion[:-1] if ended else completion
        text = self.student.text(body)
        ids = list(self.teacher.tokenizer.encode(text, add_special_tokens=False))
        return ([*ids, self.teacher_eos] if ended else ids), ended

    def pieces(
        self, completion: Sequence[int], teacher: Sequence[int], ended: bool
    ) -> tuple[list[bytes], list[bytes]]:
        """Both sides' tokens as bytes; with `ended`, their EOS as none."""
        if ended:
            body = self.student.pieces(completion[:-1]), self.teacher.pieces(teacher[:-1])
            return [*body[0], b""], [*body[1], b""]
        return self.student.pieces(completion), self.teacher.pieces(teacher)

    def view(self, completion: Sequence[int], logprobs: Sequence[float]) -> ByteView:
        """The completion as the teacher's tokens, and for each student token the teacher
        token its first byte is in and that token's bytes before it (-1 and none once the
        two texts have parted, and for a piece that begins inside a character); the
        student's end of sequence is the teacher's, where the two texts are one.
        `logprobs`: the teacher's, mapped onto the student's tokens (`Retokenized.score`)."""
        teacher, ended = self.teacher_tokens(completion)
        ours, theirs = self.pieces(completion, teacher, ended)
        text, read = b"".join(ours), b"".join(theirs)
        agreed = next(
            (i for i, (a, b) in enumerate(zip(text, read, strict=False)) if a != b),
            min(len(text), len(read)),
        )
        starts = [0, *itertools.accumulate(len(piece) for piece in theirs)]
        positions, written = [], []
        offset = 0
        for index, piece in enumerate(ours):
            if ended and index == len(ours) - 1:
                positions.append(len(teacher) - 1 if text == read else -1)
                written.append(b"")
            elif not piece or offset > agreed or offset >= len(read):
                positions.append(-1)
                written.append(b"")
            else:
                k = bisect.bisect_right(starts, offset, hi=len(theirs)) - 1
                positions.append(k)
                written.append(read[starts[k] : offset])
            offset += len(piece)
        return ByteView(teacher, positions, written, [float(v) for v in logprobs])

    def align(self, completion: Sequence[int], teacher: Sequence[int], ended: bool) -> Alignment:
        """The runs of `completion` against its teacher tokens (`ended`: both end with
        their EOS, which pair)."""
        ours, theirs = self.pieces(completion, teacher, ended)
        return align(ours, theirs, ended, self.teacher.extendable(teacher))


@dataclass(frozen=True)
class Retokenized:
    """A teacher with another tokenizer scoring the completions of one prompt (`Scorer`):
    `prompt` is the question as its own template renders it, in its own tokens."""

    name: str
    client: SamplingClient
    prompt: list[int]
    tokenizers: Tokenizers

    async def score(self, completion: list[int], student_logprobs: Sequence[float]) -> Scored:
        tokenizers = self.tokenizers
        teacher, ended = tokenizers.teacher_tokens(completion)
        alignment = tokenizers.align(completion, teacher, ended)
        topk = None
        if tokenizers.top_k:
            logprobs, topk = await teacher_prefill(
                self.client, self.prompt, teacher, tokenizers.top_k
            )
        else:
            logprobs = await teacher_logprobs(self.client, self.prompt, teacher)
        if topk is not None:
            mapped = chained(
                *tokenizers.pieces(completion, teacher, ended),
                alignment,
                student_logprobs,
                logprobs,
                [[(tokenizers.teacher.piece(t), lp) for t, lp in row] for row in topk],
            )
        else:  # no top k (a client without them, or a response that has none)
            mapped = spread(student_logprobs, logprobs, alignment.runs)
        return Scored(
            mapped,
            {self.name: len(self.prompt) + len(teacher)},
            {self.name: (alignment.aligned_bytes, alignment.total_bytes)},
        )

    def read(self, completion: list[int]) -> dict[str, int]:
        return {self.name: len(self.prompt) + len(self.tokenizers.teacher_tokens(completion)[0])}

    async def trained(
        self, completion: list[int], student_logprobs: Sequence[float]
    ) -> tuple[Scored, list[TeacherShare]]:
        """Its sampled logprobs mapped onto the student's tokens (the step's metrics), and
        the completion as its tokens (`ByteView`): the trainer compares the two models'
        next bytes."""
        scored = await self.score(completion, student_logprobs)
        view = self.tokenizers.view(completion, scored.logprobs)
        return scored, [TeacherShare(self.client, 1.0, self.prompt, view)]
