"""A teacher scoring the student's completion tokens after the prompt it reads (its own
rendering of the question): one `compute_logprobs` of prompt + completion, or one prefill
that also brings the teacher's top k at each completion position.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pytrio.types import ModelInput, SamplingParams

from kernel.errors import BackendFailure
from worker.engine.backends.contract import SamplingClient, TeacherShare
from worker.engine.rollouts.datums import TopK, completion_slice, completion_topk
from worker.engine.rollouts.sampling import Scored

TOPK_SCORING = SamplingParams(max_tokens=1)
"""A one-token sample: the prefill that scores its prompt (as Tinker's compute_logprobs)."""


async def teacher_logprobs(
    teacher: SamplingClient, prompt: list[int], completion: list[int]
) -> list[float]:
    """The teacher's logprob of each completion token, in the prompt's context."""
    all_logprobs = await teacher.compute_logprobs_async(ModelInput.from_ints(prompt + completion))
    return completion_slice(all_logprobs, len(prompt), len(completion))


@dataclass(frozen=True)
class Prompted:
    """A teacher and the prompt it reads before a completion: its own rendering of the
    question, which is the student's prompt when their chat templates agree. It scores
    `prompt + completion`, the completion's logprobs from position len(prompt) on."""

    name: str
    client: SamplingClient
    prompt: list[int]

    async def score(self, completion: list[int], student_logprobs: Sequence[float]) -> Scored:
        logprobs = await teacher_logprobs(self.client, self.prompt, completion)
        return Scored(logprobs, self.read(completion))

    async def scores(self, completion: list[int], k: int) -> tuple[list[float], list[TopK]]:
        return await teacher_scores(self.client, self.prompt, completion, k)

    def read(self, completion: list[int]) -> dict[str, int]:
        return {self.name: len(self.prompt) + len(completion)}

    async def trained(
        self, completion: list[int], student_logprobs: Sequence[float]
    ) -> tuple[Scored, list[TeacherShare]]:
        return Scored([], self.read(completion)), [TeacherShare(self.client, 1.0, self.prompt)]


async def teacher_scores(
    teacher: SamplingClient, prompt: list[int], completion: list[int], k: int
) -> tuple[list[float], list[TopK]]:
    """The teacher's logprob of each completion token and its k likeliest tokens at each
    completion position, from one prefill of prompt + completion (`teacher_prefill`); a
    response without the top k is refused."""
    logprobs, topk = await teacher_prefill(teacher, prompt, completion, k)
    if topk is None:
        raise BackendFailure(
            f"Invalid teacher top-{k} logprobs for completion tokens: the response has none",
            code="bad_teacher_logprobs",
        )
    return logprobs, topk


async def teacher_prefill(
    teacher: SamplingClient, prompt: list[int], completion: list[int], k: int
) -> tuple[list[float], list[TopK] | None]:
    """One prefill of prompt + completion (a one-token sample with the prompt's logprobs,
    as compute_logprobs asks for them, and their top k): the teacher's logprob of each
    completion token and, if the response has them, its k likeliest at each completion
    position."""
    response = await teacher.sample_async(
        ModelInput.from_ints(prompt + completion),
        num_samples=1,
        sampling_params=TOPK_SCORING,
        include_prompt_logprobs=True,
        topk_prompt_logprobs=k,
        return_text=False,
    )
    logprobs = completion_slice(response.prompt_logprobs, len(prompt), len(completion))
    if not response.topk_prompt_logprobs:
        return logprobs, None
    return logprobs, completion_topk(response.topk_prompt_logprobs, len(prompt), len(completion), k)
