"""A step's metrics, by the names people chart (docs/algorithm.md#metrics), and where its
time went.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager

import numpy as np
from pytrio.types import TensorData

from kernel.metric_names import STEP_PHASES
from worker.engine.backends.server import ServerTeacher
from worker.engine.data.mixing import Item
from worker.engine.rollouts.sampling import Batch
from worker.engine.teachers.views import TeacherView

OBJECTIVE_METRICS = {
    "objective_mean": "opd/objective_mean",
    "teacher_mass_mean": "opd/teacher_mass_mean",
}
"""What a logit-level objective's backend reports, by the names people chart: the
objective's value per completion position and, with top_k, the teacher mass kept."""


def step_metrics(
    batch: Batch,
    items: list[Item],
    trainer_metrics: dict[str, float],
    lr: float,
    step: int,
    elapsed: float,
    phases: dict[str, float],
) -> dict[str, float]:
    """The reference's metric names (docs/algorithm.md#metrics), `trainer/<name>` from the
    backend, how many optimizer steps old the rollouts were, and where the step's time went
    (`time/<phase>`)."""
    counts = [len(c.tokens) for c in batch.completions]
    kls = np.concatenate([c.reverse_kl for c in batch.completions])
    staleness = [step - c.version for c in batch.completions]
    total = int(sum(counts))
    metrics: dict[str, float] = {
        "data/datums": len(batch.completions),
        "data/completion_tokens_mean": float(np.mean(counts)),
        "data/completion_tokens_total": total,
        "data/completion_tokens_per_second": total / elapsed,
        "opd/reverse_kl_mean": float(np.mean(kls)),
        "opd/reverse_kl_std": float(np.std(kls)),
        "train/learning_rate": lr,
        "train/step": step,
        "train/staleness_mean": float(np.mean(staleness)),
        "train/staleness_max": max(staleness),
        "time/step_elapsed_time": elapsed,
        "usage/sampled_tokens": batch.sampled_tokens,
        "usage/trained_tokens": batch.datum_tokens,
    }
    metrics.update(teacher_usage(batch, items))
    metrics.update(alignment_metrics(batch))
    metrics.update(dataset_metrics(batch, items))
    metrics.update({f"time/{name}": seconds for name, seconds in phases.items()})
    for name, value in trainer_metrics.items():
        metrics[OBJECTIVE_METRICS.get(name, f"trainer/{name}")] = float(value)
    return metrics


def teacher_usage(batch: Batch, items: list[Item]) -> dict[str, float]:
    """Tokens each teacher scored, its own prompt and the completion (`usage/teacher_tokens`:
    all of them; with several teachers also `usage/teacher_tokens/<teacher>`)."""
    teachers = {name for item in items for name in item.teachers}
    per_teacher = dict.fromkeys(sorted(teachers), 0)
    for completion in batch.completions:
        for name, tokens in completion.teacher_tokens.items():
            per_teacher[name] += tokens
    metrics: dict[str, float] = {"usage/teacher_tokens": sum(per_teacher.values())}
    if len(per_teacher) > 1:
        metrics |= {f"usage/teacher_tokens/{name}": n for name, n in per_teacher.items()}
    return metrics


ALIGNED = "opd/aligned_bytes_fraction"


def alignment_metrics(batch: Batch) -> dict[str, float]:
    """With a teacher of another tokenizer: the fraction of the step's completion bytes
    its tokens aligned with the student's (`opd/aligned_bytes_fraction`; with several such
    teachers, of all of theirs, and `.../<teacher>` for each)."""
    per_teacher: dict[str, list[tuple[int, int]]] = {}
    for completion in batch.completions:
        for name, aligned in completion.aligned_bytes.items():
            per_teacher.setdefault(name, []).append(aligned)
    if not per_teacher:
        return {}
    metrics = {ALIGNED: aligned_fraction([a for pairs in per_teacher.values() for a in pairs])}
    if len(per_teacher) > 1:
        metrics |= {f"{ALIGNED}/{name}": aligned_fraction(p) for name, p in per_teacher.items()}
    return metrics


def dataset_metrics(batch: Batch, items: list[Item]) -> dict[str, float]:
    """`data/datums/<dataset>` and `opd/reverse_kl_mean/<dataset>`, with several datasets."""
    pools = {item.pool.name for item in items}
    if len(pools) < 2:
        return {}
    metrics: dict[str, float] = {}
    for name in sorted(pools):
        mine = [c for c in batch.completions if items[c.group].pool.name == name]
        metrics[f"data/datums/{name}"] = len(mine)
        if mine:
            kls = np.concatenate([c.reverse_kl for c in mine])
            metrics[f"opd/reverse_kl_mean/{name}"] = float(np.mean(kls))
    return metrics


def aligned_fraction(aligned: Sequence[tuple[int, int]]) -> float:
    """Bytes aligned over all bytes, of (aligned, total) pairs; 1 where there were none."""
    total = sum(t for _, t in aligned)
    return sum(a for a, _ in aligned) / total if total else 1.0


class PhaseTimer:
    """Times a step's phases: `with timer("train"):` records the block's seconds, `record`
    a time measured elsewhere, and `lap()` hands over one step's phases and starts the
    next step's. A phase that did not run took 0 s; `save` is the checkpoint saved at the
    boundary before the step, so it is timed after the previous step's lap."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        start = time.perf_counter()
        yield
        self.record(phase, time.perf_counter() - start)

    def record(self, phase: str, seconds: float) -> None:
        self.seconds[phase] = seconds

    def lap(self) -> dict[str, float]:
        phases = {phase: self.seconds.get(phase, 0.0) for phase in STEP_PHASES}
        self.seconds = {}
        return phases


def teacher_tier_metrics(views: Iterable[TeacherView]) -> dict[str, float]:
    """With teachers on inference servers, since the last step's: the seconds the job had
    requests outstanding there (`time/teacher_wait`, summed over the servers) and, for a
    server with replicas (OPD_TEACHER_REPLICAS), each replica's share of the requests it
    answered (`teacher/replica_share/<teacher>/<n>`, n from 1 in the operator's order)."""
    servers = [(v.name, v.client) for v in views if isinstance(v.client, ServerTeacher)]
    if not servers:
        return {}
    metrics = {"time/teacher_wait": 0.0}
    for name, client in servers:
        tally = client.tally()
        metrics["time/teacher_wait"] += tally.waited
        if len(tally.shares) > 1:
            for number, share in enumerate(tally.shares, start=1):
                metrics[f"teacher/replica_share/{name}/{number}"] = share
    return metrics


OUTSIDE_FRACTION = "opd/sampler_ratio_outside_fraction"


def sampler_logprob_diff(
    batch: Batch, outputs: Sequence[Mapping[str, TensorData]], bound: float
) -> dict[str, float]:
    """How far the sampler's logprobs of the completion tokens are from the trainer's (the
    forward pass of the step's datums, before its update), which the importance ratio
    needs to agree: the mean and the largest absolute difference, and the fraction of
    tokens whose ratio lies outside [1/bound, bound] (those `loop.sampler_correction`
    gates)."""
    differences = [
        np.abs(
            np.asarray(c.student_logprobs, dtype=np.float64)
            - np.asarray(output["logprobs"].data[-len(c.tokens) :], dtype=np.float64)
        )
        for c, output in zip(batch.completions, outputs, strict=True)
        if "logprobs" in output
    ]
    if not differences:  # a logit-level objective's outputs carry no logprobs
        return {}
    every = np.concatenate(differences)
    return {
        "opd/sampler_logprob_diff_mean": float(every.mean()),
        "opd/sampler_logprob_diff_max": float(every.max()),
        OUTSIDE_FRACTION: float(np.mean(every > np.log(bound))),
    }
