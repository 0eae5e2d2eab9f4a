"""A teacher with another tokenizer: it reads the completion's text as its own tokens.

The student's completion tokens become text (their bytes, `alignment.TokenBytes`); the
teacher tokenizes that text with its own tokenizer after its own rendering of the question,
and its end-of-sequence token after it when the student's completion ended with its own. The
teacher scores `teacher_prompt + teacher_completion` with `compute_logprobs_async` (any
client that has it: a backend's sampler, or a remote teacher server), and `alignment`
maps its logprobs onto the student's tokens by byte offsets. The datum keeps the student's
tokens, so everything after scoring is unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from worker.engine.alignment import Alignment, TokenBytes, align, spread
from worker.engine.backends.contract import SamplingClient
from worker.engine.rollouts import Scored, teacher_logprobs


@dataclass(frozen=True)
class Tokenizers:
    """The student's and a teacher's tokenizers, as bytes, and their end-of-sequence ids."""

    student: TokenBytes
    teacher: TokenBytes
    student_eos: frozenset[int]
    teacher_eos: int

    @classmethod
    def of(cls, student: Any, teacher: Any, stops: Sequence[str] = ()) -> Tokenizers:
        """`stops`: the student's stop strings that are tokens of its own (each ends a
        completion as its EOS does)."""
        vocab = student.get_vocab()
        eos = {student.eos_token_id, *(vocab[s] for s in stops if s in vocab)}
        return cls(
            TokenBytes(student),
            TokenBytes(teacher),
            frozenset(i for i in eos if i is not None),
            teacher.eos_token_id,
        )

    def teacher_tokens(self, completion: Sequence[int]) -> tuple[list[int], bool]:
        """The completion as the teacher's tokens, and whether both end with their EOS."""
        ended = bool(completion) and completion[-1] in self.student_eos
        body = completion[:-1] if ended else completion
        text = self.student.text(body)
        ids = list(self.teacher.tokenizer.encode(text, add_special_tokens=False))
        return ([*ids, self.teacher_eos] if ended else ids), ended

    def align(self, completion: Sequence[int], teacher: Sequence[int], ended: bool) -> Alignment:
        """The runs of `completion` against its teacher tokens (`ended`: both end with
        their EOS, which pair)."""
        if ended:
            body = self.student.pieces(completion[:-1]), self.teacher.pieces(teacher[:-1])
            return align([*body[0], b""], [*body[1], b""], eos=True)
        return align(self.student.pieces(completion), self.teacher.pieces(teacher))


@dataclass(frozen=True)
class Retokenized:
    """A teacher with another tokenizer scoring the completions of one prompt (`Scorer`):
    `prompt` is the question as its own template renders it, in its own tokens."""

    name: str
    client: SamplingClient
    prompt: list[int]
    tokenizers: Tokenizers

    async def score(self, completion: list[int], student_logprobs: Sequence[float]) -> Scored:
        teacher, ended = self.tokenizers.teacher_tokens(completion)
        logprobs = await teacher_logprobs(self.client, self.prompt, teacher)
        alignment = self.tokenizers.align(completion, teacher, ended)
        return Scored(
            spread(student_logprobs, logprobs, alignment.runs),
            {self.name: len(self.prompt) + len(teacher)},
            {self.name: (alignment.aligned_bytes, alignment.total_bytes)},
        )

    def read(self, completion: list[int]) -> dict[str, int]:
        return {self.name: len(self.prompt) + len(self.tokenizers.teacher_tokens(completion)[0])}
