"""Held-out evaluation of the student, on a schedule, without touching the training run.

At each scheduled boundary (weights after k optimizer steps) the student samples the
held-out prompts from a sampler of its own (so the training sampler's draws are not
shifted) with a fixed seed (so a resumed job reproduces the numbers), the teacher scores
the tokens, and the answers are graded against the reference answers when there are any.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np
from pytrio.types import SamplingParams

from kernel.spec import EvalSpec
from worker.engine.backends.contract import SamplingClient
from worker.engine.rollouts.sampling import Batch, Completion, Scorer, sample_and_score

if TYPE_CHECKING:
    from worker.engine.teachers.views import Answerer

Grade = Callable[[list[str], list[str]], Awaitable[list[bool]]]
"""Whether each completion's final answer matches its reference answer."""
Answered = Callable[[], None] | None
"""Called as each held-out prompt is answered: how an eval's progress is told."""
EVAL_TOKENS = "usage/eval_tokens"
"""Every token an eval sampled or scored."""


def due(spec: EvalSpec, step: int, total_steps: int) -> bool:
    """Evals run before the first step, after the last, and every `spec.every` steps."""
    return step in (0, total_steps) or (spec.every > 0 and step % spec.every == 0)


@dataclass
class Evaluation:
    """Everything one job's evals share: the prompts, how to sample, and how to grade."""

    spec: EvalSpec
    prompts: Sequence[list[int]]
    """Each prompt as the student's chat template renders it."""
    answers: Sequence[str | None]
    params: SamplingParams
    teachers: Callable[[SamplingClient], Sequence[Scorer]]
    """What scores each prompt's completions that a sampler sampled (its dataset's
    teacher, or the mixture), each teacher after its own rendering of the prompt."""
    answerers: Callable[[SamplingClient], Sequence[Answerer]]
    """The teacher that answers each prompt for the baseline beside a sampler of the
    student (a self teacher of `current` weights is that sampler), its rendering and, with
    another tokenizer, how its answers are decoded and where they stop."""
    decode: Callable[[list[int]], str]
    grade: Grade | None
    sources: Sequence[str] = ()
    """Each prompt's dataset, when the figures are also recorded per dataset."""
    reads_answers: bool = True
    """Whether the grader compares with the reference answers (boxed), so only the
    prompts that have one are graded; a format grader grades every completion."""

    def size(self, step: int) -> int:
        """The prompts the eval after `step` steps answers: the student's, and at step 0
        the teacher's baseline's too."""
        baseline = step == 0 and self.spec.teacher_baseline
        return len(self.prompts) * (2 if baseline else 1)

    def most_tokens(self, step: int, readers: int) -> int:
        """The most the eval after `step` steps may count (EVAL_TOKENS), in the student's
        tokens: each prompt's samples run to max_tokens, each read by `readers` teachers
        after the prompt; at step 0 the teacher's baseline as much again."""
        longest, samples = self.params.max_tokens, self.spec.samples_per_prompt
        one = sum(samples * (longest + readers * (len(p) + longest)) for p in self.prompts)
        return one * (2 if step == 0 and self.spec.teacher_baseline else 1)

    async def student(self, sampler: SamplingClient, answered: Answered = None) -> dict[str, float]:
        """The student with a sampler of its current weights, against the teacher
        (`answered` is called as each prompt is answered)."""
        started = time.perf_counter()
        batch = await self.sample(
            sampler,
            self.teachers(sampler),
            self.prompts,
            range(len(self.prompts)),
            answered=answered,
        )
        metrics = await self.per_source(batch, self.student_figures)
        metrics[EVAL_TOKENS] = self.tokens(batch)
        return metrics | {"time/eval": time.perf_counter() - started}

    async def student_figures(self, batch: Batch) -> dict[str, float]:
        metrics = {"eval/reverse_kl_mean": reverse_kl_mean(batch.completions)}
        return metrics | await self.answers_metrics(batch, "eval/")

    async def teacher_baseline(
        self, sampler: SamplingClient, answered: Answered = None
    ) -> dict[str, float]:
        """The teachers answering the same prompts, each from its own rendering (a self
        teacher's context): what the student is reaching for. `sampler`: the student's,
        which a self teacher of `current` weights answers with."""
        answerers = self.answerers(sampler)
        completions, tokens = [], 0
        for first in {id(a.scorer.client): a for a in answerers}.values():
            client = first.scorer.client
            asked = [i for i, a in enumerate(answerers) if a.scorer.client is client]
            scorers = [answerers[i].scorer for i in asked]
            prompts = [scorer.prompt for scorer in scorers]
            batch = await self.sample(client, scorers, prompts, asked, first.stop, answered)
            completions += batch.completions
            tokens += self.tokens(batch)
        decodes = [a.decode or self.decode for a in answerers]
        metrics = await self.per_source(
            Batch(completions), lambda batch: self.answers_metrics(batch, "eval/teacher_", decodes)
        )
        return metrics | {EVAL_TOKENS: tokens}

    def tokens(self, batch: Batch) -> int:
        """The tokens sampled, and those scored by each teacher that scored them."""
        return batch.sampled_tokens + batch.scored_tokens

    async def sample(
        self,
        sampler: SamplingClient,
        scorers: Sequence[Scorer],
        prompts: Sequence[list[int]],
        asked: Sequence[int],
        stop: list[str] | None = None,
        answered: Answered = None,
    ) -> Batch:
        """The completions of `prompts`, the eval's prompts `asked` (by index), each
        scored by its scorer and knowing its index: the student's prompts scored by their
        teachers, or (the baseline) the teachers' own prompts, each scored by the teacher
        answering it, which stops at `stop`."""
        batch = await sample_and_score(
            sampler,
            scorers,
            prompts,
            self.spec.samples_per_prompt,
            self.params if stop is None else self.params.model_copy(update={"stop": stop}),
            answered=answered,
        )
        batch.completions = [replace(c, group=asked[c.group]) for c in batch.completions]
        return batch

    async def per_source(
        self, batch: Batch, figures: Callable[[Batch], Awaitable[dict[str, float]]]
    ) -> dict[str, float]:
        """The figures of the whole batch and, with several datasets, of each one's
        completions (the names end in `/<dataset>`)."""
        metrics = await figures(batch)
        for source in dict.fromkeys(self.sources):
            part = Batch([c for c in batch.completions if self.sources[c.group] == source])
            if part.completions:
                metrics |= {f"{k}/{source}": v for k, v in (await figures(part)).items()}
        return metrics

    async def answers_metrics(
        self,
        batch: Batch,
        prefix: str,
        decodes: Sequence[Callable[[list[int]], str]] | None = None,
    ) -> dict[str, float]:
        """Length, truncation and, where there are reference answers, accuracy (each
        prompt's completions decoded by its `decodes`, else by the student's tokenizer)."""
        completions = batch.completions
        metrics = {
            f"{prefix}completion_tokens_mean": float(np.mean([len(c.tokens) for c in completions])),
            f"{prefix}truncated_fraction": float(
                np.mean([c.stop_reason == "length" for c in completions])
            ),
        }
        graded = [
            (c, a)
            for c, a in zip(completions, self.answer_per_completion(batch), strict=True)
            if a is not None or not self.reads_answers
        ]
        if self.grade is None or not graded:
            return metrics
        correct = await self.grade(
            [(decodes[c.group] if decodes else self.decode)(c.tokens) for c, _ in graded],
            [a or "" for _, a in graded],
        )
        metrics[f"{prefix}accuracy"] = float(np.mean(correct))
        k = self.spec.samples_per_prompt
        if k > 1:
            metrics[f"{prefix}pass@{k}"] = pass_at_all(graded, correct)
        return metrics

    def answer_per_completion(self, batch: Batch) -> list[str | None]:
        return [self.answers[c.group] for c in batch.completions]


def with_baseline(student: dict[str, float], baseline: dict[str, float]) -> dict[str, float]:
    """The student's eval figures and the teacher baseline's, their token usage added up."""
    return student | baseline | {EVAL_TOKENS: student[EVAL_TOKENS] + baseline[EVAL_TOKENS]}


def reverse_kl_mean(completions: Sequence[Completion]) -> float:
    return float(np.mean(np.concatenate([c.reverse_kl for c in completions])))


def pass_at_all(graded: Sequence[tuple[Completion, str | None]], correct: Sequence[bool]) -> float:
    """The fraction of prompts with at least one correct answer among all their samples:
    pass@k with k = samples_per_prompt."""
    solved: dict[tuple[int, ...], bool] = {}
    for (completion, _), ok in zip(graded, correct, strict=True):
        key = tuple(completion.prompt)
        solved[key] = solved.get(key, False) or ok
    return float(np.mean(list(solved.values())))
