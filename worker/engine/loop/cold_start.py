"""Completions the student did not sample, for the first steps of a job (`loop.cold_start`).

A student that cannot yet write in its teacher's format never samples the part the teacher
could teach it (a 135M chat model asked for `\\boxed{}` writes prose until `max_tokens`,
which a teacher trained on boxed answers cannot read). For its first steps each prompt's
completions are written by someone else: its teacher, answering from its own rendering of
the question (re-tokenised for the student when their tokenizers differ), or the dataset's
reference answer. Each becomes the student's tokens with the student's own logprob of each
(the importance ratio starts at 1, as for a sampled token) and is then scored and trained
exactly as a rollout is, with the job's objective: GOLD's off-policy share.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Sequence
from typing import Any

from pytrio.types import ModelInput, SampleSequence, SamplingParams

from kernel.errors import OPDError
from worker.engine.backends.contract import SamplingClient
from worker.engine.rollouts.datums import completion_slice
from worker.engine.rollouts.sampling import Draw
from worker.engine.teachers.views import Answerer


def cold_seed(seed: int | None, step: int, index: int) -> int | None:
    """The seed of the teacher's answers to a cold start step's prompt: its own, so they
    are the same whatever the teacher was asked before (a resumed run's too)."""
    if seed is None:
        return None
    digest = hashlib.sha256(f"cold:{seed}:{step}:{index}".encode()).digest()
    return int.from_bytes(digest[:4], "big") >> 1


def teacher_answers(
    student: SamplingClient,
    answerers: Sequence[Answerer],
    num_samples: int,
    params: SamplingParams,
    tokenizer: Any,
    seeds: Sequence[int | None],
) -> Draw:
    """Each prompt's teacher (`answerers`, by index) answers it `num_samples` times at the
    job's sampling settings (seeded by `seeds`, by index), stopping where it stops; its
    answers are the student's tokens (its own, when the two share a tokenizer), scored by
    `student`'s weights."""

    async def draw(index: int, prompt: list[int]) -> Sequence[SampleSequence]:
        answerer = answerers[index]
        asked = params.model_copy(update={"seed": seeds[index]})
        if answerer.stop is not None:
            asked = asked.model_copy(update={"stop": answerer.stop})
        result = await answerer.scorer.client.sample_async(
            prompt=ModelInput.from_ints(answerer.scorer.prompt),
            num_samples=num_samples,
            sampling_params=asked,
            return_text=False,
        )
        written = [
            (list(seq.tokens), seq.stop_reason)
            if answerer.decode is None
            else retokenised(answerer.decode(list(seq.tokens)), seq.stop_reason, tokenizer, params)
            for seq in result.sequences
        ]
        return await scored_by(student, prompt, written)

    return draw


def reference_answers(
    student: SamplingClient, answers: Sequence[str | None], params: SamplingParams, tokenizer: Any
) -> Draw:
    """Each prompt's reference answer (`answers`, by index) as its one completion, ended
    as the student ends a turn, scored by `student`'s weights."""

    async def draw(index: int, prompt: list[int]) -> Sequence[SampleSequence]:
        answer = answers[index]
        if answer is None:
            raise OPDError(
                "loop.cold_start.source is reference, and a training prompt has no reference "
                "answer: give the dataset its answers (answer_field), or source: teacher",
                code="bad_dataset",
            )
        return await scored_by(student, prompt, [retokenised(answer, "stop", tokenizer, params)])

    return draw


def retokenised(
    text: str, stop_reason: str, tokenizer: Any, params: SamplingParams
) -> tuple[list[int], str]:
    """`text` as the student's tokens, ended with its end of turn if the writer stopped
    there, cut at `params.max_tokens` as the student's own samples are."""
    tokens = list(tokenizer.encode(text, add_special_tokens=False))
    if stop_reason == "stop":
        tokens.append(tokenizer.eos_token_id)
    limit = params.max_tokens
    if limit is not None and len(tokens) > limit:
        return tokens[:limit], "length"
    return tokens, stop_reason


async def scored_by(
    student: SamplingClient, prompt: list[int], written: Sequence[tuple[list[int], str]]
) -> list[SampleSequence]:
    """The written completions with the student's logprob of each token, from one
    `compute_logprobs` of prompt + completion each."""

    async def one(tokens: list[int], stop_reason: str) -> SampleSequence:
        logprobs = await student.compute_logprobs_async(ModelInput.from_ints(prompt + tokens))
        return SampleSequence(
            stop_reason=stop_reason,
            tokens=tokens,
            logprobs=completion_slice(logprobs, len(prompt), len(tokens)),
        )

    return list(await asyncio.gather(*(one(tokens, why) for tokens, why in written if tokens)))
