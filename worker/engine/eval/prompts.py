"""Where a job's eval prompts come from, and the grader their answers need."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from pathlib import Path

from kernel.spec import JobSpec
from kernel.storage.cache import BlobCache
from worker.engine.data.datasets import load_holdout, load_prompts
from worker.engine.data.prompts import Prompts
from worker.engine.eval.evaluation import Grade

EVAL_DATASET = "eval"
"""The name eval.dataset's prompts go by."""


def load_eval_prompts(
    spec: JobSpec, data_root: Path, confine: bool, blobs: BlobCache | None = None
) -> dict[str, Prompts]:
    """The eval's own dataset, or `holdout` prompts of each dataset that its training pool
    does not use, by dataset name."""
    assert spec.eval is not None
    if spec.eval.dataset is not None:
        return {EVAL_DATASET: load_prompts(spec.eval.dataset, data_root, confine, blobs)}
    return {
        share.name: load_holdout(
            share, spec.eval.holdout, spec.eval.seed, data_root, confine, blobs
        )
        for share in spec.dataset_shares()
    }


def graded_prompts(
    spec: JobSpec, prompts: dict[str, Prompts], eval_prompts: dict[str, Prompts]
) -> list[Prompts]:
    """The prompts whose answers math-verify grades: the eval's (unless its grader is a
    format's), and the training prompts' with a reward (`loop.reward`)."""
    boxed = spec.eval is not None and spec.eval.grader.boxed
    return [
        *(eval_prompts.values() if boxed else []),
        *(prompts.values() if spec.loop.reward.coef else []),
    ]


@asynccontextmanager
async def open_grader(prompts: Iterable[Prompts]) -> AsyncIterator[Grade | None]:
    """A grader for the answers (its process pool lives as long as the run), or None when
    no prompt has a reference answer: the eval then records the KL figures only."""
    if all(answer is None for pool in prompts for answer in pool.answers):
        yield None
        return
    from worker.engine.eval.grading import Grader

    async with Grader() as grader:
        yield grader.grade_answers
