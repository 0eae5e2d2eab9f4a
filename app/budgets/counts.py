"""What a job will sample, score, train and evaluate, in tokens: the arithmetic alone.

A job's tokens are products of counts its spec fixes (steps, completions a step, evals,
eval prompts, the teachers reading each completion) and lengths nobody knows before it
runs (a completion's, a rendered prompt's). Each length is a `Span`: the shortest it can
be, the best guess, the longest. The figures follow the loop's own accounting
(worker/engine/loop/metrics.py, worker/engine/eval/evaluation.py):

- sampled: every completion's tokens;
- trained: each datum is prompt + completion[:-1];
- teacher: each teacher that scores a completion reads its own prompt and the completion;
- eval: each eval samples its prompts' completions and their teachers read them; the
  teacher baseline (once, before the first step) lets each teacher answer its prompts
  and reads its own answers.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Span:
    """A length (or a count of tokens) from its least to its most, with a best guess."""

    low: float
    point: float
    high: float

    @classmethod
    def exactly(cls, value: float) -> Span:
        return cls(value, value, value)

    def __add__(self, other: Span) -> Span:
        return Span(self.low + other.low, self.point + other.point, self.high + other.high)

    def __mul__(self, factor: float) -> Span:
        return Span(self.low * factor, self.point * factor, self.high * factor)

    def scaled(self, by: Span) -> Span:
        """Each bound by the same bound of `by` (a rate that is itself a span)."""
        return Span(self.low * by.low, self.point * by.point, self.high * by.high)

    def rounded(self) -> Span:
        """Whole tokens, each bound rounded outwards."""
        return Span(int(self.low), round(self.point), -int(-self.high // 1))


@dataclass(frozen=True)
class Shape:
    """What the spec fixes: how many completions, evals and readers a run has."""

    steps: int
    completions_per_step: int
    readers: int
    """Teachers that score each completion: one (its dataset's, or the one teacher), or
    every teacher of a mixture."""
    evals: int
    eval_completions: int
    """Completions one eval samples: its prompts times samples_per_prompt."""
    baseline: bool = False


@dataclass(frozen=True)
class Lengths:
    """Tokens per completion or prompt, each a span."""

    completion: Span
    prompt: Span
    """The student's rendered prompt."""
    teacher_prompt: Span
    """A teacher's rendered prompt (its own template, or the student's)."""
    eval_completion: Span
    baseline_completion: Span
    teacher_per_token: Span = Span(1, 1, 1)
    """A teacher's tokens per student token of a completion it reads: 1 with the student's
    tokenizer; another tokenizer reads the same text in fewer or more."""


@dataclass(frozen=True)
class Tokens:
    sampled: Span
    teacher: Span
    trained: Span
    eval: Span


def one_off(value: Span) -> Span:
    """A length less one token, never below zero (a datum drops the completion's last)."""
    return Span(max(value.low - 1, 0), max(value.point - 1, 0), max(value.high - 1, 0))


def tokens(shape: Shape, lengths: Lengths) -> Tokens:
    """The four figures of a whole run."""
    completions = shape.steps * shape.completions_per_step
    ratio = lengths.teacher_per_token
    read = lengths.teacher_prompt + lengths.completion.scaled(ratio)
    scored = (lengths.teacher_prompt + lengths.eval_completion.scaled(ratio)) * shape.readers
    evals = (lengths.eval_completion + scored) * (shape.eval_completions * shape.evals)
    if shape.baseline:
        answer = lengths.baseline_completion
        evals = evals + (answer + lengths.teacher_prompt + answer) * shape.eval_completions
    return Tokens(
        sampled=(lengths.completion * completions).rounded(),
        teacher=(read * (completions * shape.readers)).rounded(),
        trained=((lengths.prompt + one_off(lengths.completion)) * completions).rounded(),
        eval=evals.rounded(),
    )


def eval_boundaries(steps: int, every: int) -> int:
    """How many evals a run of `steps` steps makes: before the first step, after the
    last, and every `every` steps between (evaluation.due)."""
    return 2 + ((steps - 1) // every if every else 0)


def share_run(rungs: list[int], steps: int, keep: float) -> Span:
    """The share of its steps a trial runs under early stopping judged at `rungs`, with
    `keep` of the trials going on at each: at least to the first rung, as expected when
    each rung keeps its share, at most all of them."""
    if not rungs:
        return Span.exactly(1)
    expected, kept, start = 0.0, 1.0, 0
    for rung in [*rungs, steps]:
        expected += kept * (rung - start)
        kept, start = kept * keep, rung
    return Span(rungs[0] / steps, expected / steps, 1)


def early_stopping_saving(trials: list[tuple[Span, Span]]) -> Span:
    """Tokens early stopping may save of trials, each given as (its tokens, the share of its
    steps it runs): none at least (every trial runs to its end); as expected, each its
    expected share; at most, every trial stopped at its first rung but the one whose stop
    would save least (some trial is the best and runs on)."""
    if len(trials) < 2:
        return Span.exactly(0)
    expected = sum(tokens.point * (1 - share.point) for tokens, share in trials)
    most = [tokens.high * (1 - share.low) for tokens, share in trials]
    return Span(0, expected, sum(most) - min(most)).rounded()
