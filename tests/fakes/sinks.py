"""A real Sink that keeps everything the loop reports, and the metric names it must report.
Every metric it is given must be one the metric reference lists (kernel/metric_names.py): the
tests that run loops through it keep that list complete."""

from __future__ import annotations

from typing import Any

from kernel.metric_names import documented
from kernel.progress import JobProgress
from kernel.samples import KeptSample
from worker.engine.tracking.sinks import RunInfo, Sink

# The step metrics the reference scripts record, besides trainer/<name>: people chart them, so
# none may be renamed (docs/algorithm.md#metrics).
REFERENCE_METRICS = {
    "data/datums",
    "data/completion_tokens_mean",
    "data/completion_tokens_total",
    "data/completion_tokens_per_second",
    "opd/reverse_kl_mean",
    "opd/reverse_kl_std",
    "train/learning_rate",
    "time/step_elapsed_time",
}


class RecordingSink(Sink):
    def __init__(self) -> None:
        self.info: RunInfo | None = None
        self.steps: dict[int, dict[str, float]] = {}
        self.evals: dict[int, dict[str, float]] = {}
        self.kept: dict[int, list[KeptSample]] = {}
        self.checkpoints: list[tuple[int, str, str]] = []
        self.events: list[tuple[str, str, dict[str, Any] | None]] = []
        self.progress_told: list[JobProgress] = []
        self.closed = False

    def start(self, info: RunInfo) -> None:
        self.info = info

    def step(self, step: int, metrics: dict[str, float]) -> None:
        assert_documented(metrics)
        self.steps[step] = metrics

    def eval(self, step: int, metrics: dict[str, float]) -> None:
        assert_documented(metrics)
        self.evals[step] = metrics

    def samples(self, step: int, samples: list[KeptSample]) -> None:
        self.kept[step] = samples

    def checkpoint(self, step: int, kind: str, path: str) -> None:
        self.checkpoints.append((step, kind, path))

    def event(self, level: str, message: str, data: dict[str, Any] | None = None) -> None:
        self.events.append((level, message, data))

    def progress(self, progress: JobProgress) -> None:
        self.progress_told.append(progress)

    def close(self) -> None:
        self.closed = True


def assert_documented(metrics: dict[str, float]) -> None:
    missing = sorted(name for name in metrics if not documented(name))
    assert not missing, f"metrics kernel/metric_names.py does not list: {missing}"
