"""Sampling a batch of prompts and scoring every completion with the teacher.

Each prompt comes with what scores its completions (`Scorer`): its teacher after the
teacher's own rendering of the question (teachers/scoring.py's `Prompted`; the student's
prompt itself when the two chat templates agree; `cross_tokenizer.Retokenized` for a
teacher with another tokenizer), or a mixture of teachers. All prompts of a batch are sampled
concurrently and each completion is scored as soon as its prompt's group is back, as the
async reference does; batches sampled at the same time (the pipelined loop) take turns at
the teacher. The batch also reports where its time went: the wall time until the last
group was sampled, then until the last score.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, runtime_checkable

import numpy as np
from pytrio.types import Datum, ModelInput, SampleSequence, SamplingParams, TensorData

from kernel.errors import BackendFailure
from worker.engine.backends.contract import SamplingClient, TeacherShare
from worker.engine.rollouts.datums import TopK, build_opd_datum, kl_advantages


@dataclass(frozen=True)
class Completion:
    """One sampled completion with the student's and the teacher's view of each token."""

    prompt: list[int]
    tokens: list[int]
    student_logprobs: list[float]
    teacher_logprobs: list[float]
    stop_reason: str
    version: int = 0
    """The optimizer steps taken by the weights that sampled it."""
    group: int = 0
    """The index of its prompt in the batch."""
    teacher_topk: list[TopK] | None = None
    """With an objective over the teacher's top-k on Tinker: the teacher's k likeliest
    (token, logprob) at each completion position (`teacher_scores`)."""
    teacher_tokens: Mapping[str, int] = field(default_factory=dict)
    """Tokens each teacher (by name) reads to score it: its own prompt and the completion."""
    aligned_bytes: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    """For each teacher with another tokenizer (by name): the completion's bytes its tokens
    aligned with the student's, and all of them (`alignment.align`)."""
    teachers: Sequence[TeacherShare] = ()
    """When the trainer scores it (a logit-level objective on the local backend): the
    teachers it reads, each after its own prompt (`Scorer.trained`)."""

    @property
    def reverse_kl(self) -> np.ndarray:
        return np.subtract(self.student_logprobs, self.teacher_logprobs)


@dataclass
class Batch:
    """Every completion of a step's prompts, in prompt order, and the phases' wall times."""

    completions: list[Completion] = field(default_factory=list)
    sample_seconds: float = 0.0
    teacher_seconds: float = 0.0

    @property
    def sampled_tokens(self) -> int:
        return sum(len(c.tokens) for c in self.completions)

    @property
    def scored_tokens(self) -> int:
        """Prompt + completion tokens the teachers scored, each its own prompt."""
        return sum(sum(c.teacher_tokens.values()) for c in self.completions)

    @property
    def datum_tokens(self) -> int:
        """Tokens of the batch's datums: each is prompt + completion[:-1]."""
        return sum(len(c.prompt) + len(c.tokens) - 1 for c in self.completions)


def with_teacher_logprobs(batch: Batch, outputs: Sequence[Mapping[str, TensorData]]) -> Batch:
    """The batch with each completion's teacher logprobs taken from its datum's training
    output (`teacher_logprobs`, one per datum position: the completion's are the last),
    where the rollouts left them to the trainer (`Scorer.trained`)."""
    completions = [
        completion
        if completion.teacher_logprobs
        else replace(
            completion,
            teacher_logprobs=[
                float(v) for v in output["teacher_logprobs"].data[-len(completion.tokens) :]
            ],
        )
        for completion, output in zip(batch.completions, outputs, strict=True)
    ]
    return replace(batch, completions=completions)


@dataclass(frozen=True)
class Scored:
    """A completion as its scorer saw it: the logprob of each of its (student) tokens, the
    tokens each teacher read, and what each cross-tokenizer teacher aligned."""

    logprobs: list[float]
    teacher_tokens: dict[str, int]
    aligned_bytes: dict[str, tuple[int, int]] = field(default_factory=dict)


class Scorer(Protocol):
    """What scores the completions of one prompt: a teacher (`Prompted`, `Retokenized`) or
    a mixture."""

    async def score(self, completion: list[int], student_logprobs: Sequence[float]) -> Scored:
        """The logprob of each completion token (a teacher with another tokenizer maps its
        own onto them, against the student's), and what it took."""
        ...

    def read(self, completion: list[int]) -> dict[str, int]:
        """Tokens each teacher reads to score this completion (when the trainer scores it)."""
        ...

    async def trained(
        self, completion: list[int], student_logprobs: Sequence[float]
    ) -> tuple[Scored, list[TeacherShare]]:
        """What the trainer needs to score a completion itself (a logit-level objective on
        the local backend): the teachers as it reads them (each one's sampler, weight and
        own prompt; with another tokenizer, the completion as its tokens), and what the
        rollouts still score (such a teacher's sampled logprobs mapped onto the student's
        tokens, for the step's metrics; nothing for a teacher the trainer reads at the
        student's own tokens)."""
        ...


@runtime_checkable
class TopKScorer(Scorer, Protocol):
    """A teacher that also gives its k likeliest tokens at each completion position
    (`teachers/scoring.py`'s `Prompted`)."""

    async def scores(self, completion: list[int], k: int) -> tuple[list[float], list[TopK]]: ...


class ScoringTurn:
    """A batch's turn at the teacher when batches sampled at the same time share `lock`:
    taken when its first group is ready to be scored, held until its last score. Groups
    ready together all wait for the same taking, so they send their requests together, as
    when nothing else is scoring (the local backend batches the requests that arrive
    together, and what shares a batch can change the last bits)."""

    def __init__(self, lock: asyncio.Lock | None) -> None:
        self.lock = lock
        self.taken: asyncio.Task[bool] | None = None

    async def wait(self) -> None:
        if self.lock is None:
            return
        if self.taken is None:
            self.taken = asyncio.create_task(self.lock.acquire())
        await asyncio.shield(self.taken)

    def end(self) -> None:
        if self.lock is None or self.taken is None:
            return
        if self.taken.done() and not self.taken.cancelled():
            self.lock.release()
        else:
            self.taken.cancel()


Draw = Callable[[int, list[int]], Awaitable[Sequence[SampleSequence]]]
"""The completions of the prompt at an index of the batch, with the student's logprob of
each token: sampled by the student (`sampled`), or written by someone else
(`loop/cold_start.py`)."""


def sampled(sampler: SamplingClient, num_samples: int, params: SamplingParams) -> Draw:
    """The student's own `num_samples` completions of each prompt (on-policy)."""

    async def draw(index: int, prompt: list[int]) -> Sequence[SampleSequence]:
        result = await sampler.sample_async(
            prompt=ModelInput.from_ints(prompt),
            num_samples=num_samples,
            sampling_params=params,
            return_text=False,
        )
        return result.sequences

    return draw


async def sample_and_score(
    sampler: SamplingClient,
    scorers: Sequence[Scorer],
    prompts: Sequence[list[int]],
    num_samples: int,
    params: SamplingParams,
    version: int = 0,
    scoring: asyncio.Lock | None = None,
    teacher_top_k: int = 0,
    scored: bool = True,
    draw: Draw | None = None,
    answered: Callable[[], None] | None = None,
) -> Batch:
    """`num_samples` completions of each prompt, each scored by the prompt's scorer (its
    teacher after its own rendering of the question, or a mixture); `version` is the
    optimizer steps taken by the sampler's weights. Batches sampled at the same time pass
    the same `scoring` lock: their scoring never interleaves (`ScoringTurn`).
    `teacher_top_k` k >= 1 also keeps the teacher's top k at each completion position
    (`teacher_scores`; the scorers are then `Prompted`). `scored` False leaves the
    teacher's logprobs empty, for the trainer to fill in (`with_teacher_logprobs`).
    `draw`: where the completions come from (default: `sampler` samples them).
    `answered` is called as each prompt's completions are sampled and scored."""
    start = time.perf_counter()
    sampled_at: list[float] = []
    turn = ScoringTurn(scoring)
    draw = draw or sampled(sampler, num_samples, params)

    async def group(index: int, prompt: list[int]) -> list[Completion]:
        drawn = await draw(index, prompt)
        sampled_at.append(time.perf_counter())
        sequences = [seq for seq in drawn if seq.tokens]
        for seq in sequences:
            if len(seq.logprobs or []) != len(seq.tokens):
                raise BackendFailure(
                    f"Student token/logprob length mismatch: {len(seq.tokens)} != "
                    f"{len(seq.logprobs or [])}",
                    code="bad_sampler_logprobs",
                )
        await turn.wait()
        scorer = scorers[index]
        shares: list[list[TeacherShare]] = [[] for _ in sequences]
        if not scored:
            trained = await asyncio.gather(
                *(scorer.trained(seq.tokens, seq.logprobs or []) for seq in sequences)
            )
            done = [each for each, _ in trained]
            shares = [teachers for _, teachers in trained]
            topks: list[list[TopK] | None] = [None] * len(sequences)
        elif teacher_top_k:
            assert isinstance(scorer, TopKScorer), "a teacher's top-k needs one teacher"
            both = await asyncio.gather(
                *(scorer.scores(seq.tokens, teacher_top_k) for seq in sequences)
            )
            done = [
                Scored(s, scorer.read(q.tokens)) for (s, _), q in zip(both, sequences, strict=True)
            ]
            topks = [t for _, t in both]
        else:
            done = await asyncio.gather(
                *(scorer.score(seq.tokens, seq.logprobs or []) for seq in sequences)
            )
            topks = [None] * len(sequences)
        return [
            Completion(
                prompt,
                list(seq.tokens),
                [float(v) for v in seq.logprobs],
                scored.logprobs,
                seq.stop_reason,
                version,
                index,
                topk,
                scored.teacher_tokens,
                scored.aligned_bytes,
                teachers,
            )
            for seq, scored, topk, teachers in zip(sequences, done, topks, shares, strict=True)
        ]

    async def counted(index: int, prompt: list[int]) -> list[Completion]:
        completions = await group(index, prompt)
        if answered is not None:
            answered()
        return completions

    try:
        groups = await asyncio.gather(*(counted(i, prompt) for i, prompt in enumerate(prompts)))
    finally:
        turn.end()
    done = time.perf_counter()
    last_sampled = max(sampled_at, default=done)
    return Batch(
        completions=[c for g in groups for c in g],
        sample_seconds=last_sampled - start,
        teacher_seconds=done - last_sampled,
    )


def opd_datums(
    completions: Sequence[Completion],
    kl_penalty_coef: float,
    kl_discount_factor: float,
    bonus: Sequence[float] | None = None,
) -> list[Datum]:
    """One training datum per completion, its advantage the (discounted) negative KL,
    plus the completion's `bonus` (the reward term) on every token."""
    datums = []
    for index, completion in enumerate(completions):
        _, advantages = kl_advantages(
            completion.student_logprobs,
            completion.teacher_logprobs,
            kl_penalty_coef,
            kl_discount_factor,
        )
        if bonus is not None:
            advantages = advantages + bonus[index]
        datums.append(
            build_opd_datum(
                completion.prompt, completion.tokens, completion.student_logprobs, advantages
            )
        )
    return datums


def logit_datums(
    completions: Sequence[Completion], bonus: Sequence[float] | None = None
) -> list[Datum]:
    """One datum per completion for a logit-level objective: its completion positions
    marked by `weights`, its advantage only the completion's `bonus` (the reward term),
    since the objective itself takes its gradient from the distributions; the teacher's
    top-k with it where the completion has one (Tinker)."""
    return [
        build_opd_datum(
            completion.prompt,
            completion.tokens,
            completion.student_logprobs,
            np.full(len(completion.tokens), bonus[index] if bonus is not None else 0.0),
            weighted=True,
            teacher_topk=completion.teacher_topk,
        )
        for index, completion in enumerate(completions)
    ]


def stop_sequences(tokenizer: Any) -> list[str]:
    """Where the student's completions stop: its EOS token and ChatML's turn end."""
    return list(dict.fromkeys(x for x in (tokenizer.eos_token, "<|im_end|>") if x))
