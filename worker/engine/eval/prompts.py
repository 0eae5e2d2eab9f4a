"""Where a job's eval prompts come from, and the grader their answers need."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from kernel.spec import JobSpec
from worker.engine.datasets import Prompts, load_holdout, load_prompts
from worker.engine.eval.evaluation import Grade


def load_eval_prompts(spec: JobSpec, data_root: Path, confine: bool) -> Prompts:
    """The eval's own dataset, or `holdout` prompts the training pool does not use."""
    assert spec.eval is not None
    if spec.eval.dataset is not None:
        return load_prompts(spec.eval.dataset, data_root, confine)
    return load_holdout(spec.dataset, spec.eval.holdout, spec.eval.seed, data_root, confine)


@asynccontextmanager
async def open_grader(prompts: Prompts | None) -> AsyncIterator[Grade | None]:
    """A grader for the eval's answers (its process pool lives as long as the run), or
    None when no prompt has a reference answer: the eval then records the KL figures only."""
    if prompts is None or all(answer is None for answer in prompts.answers):
        yield None
        return
    from worker.engine.eval.grading import Grader

    async with Grader() as grader:
        yield grader.grade_answers
