"""Where a run reports: each step's metrics, each checkpoint and each event.

The loop talks to one `Sink`; `FanOut` sends to many. Console, JSONL and SwanLab sinks
live here; the service adds a database sink. Every method has a no-op default so a
sink implements only what it records.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TextIO

from tqdm import tqdm

from kernel.metric_names import REVERSE_KL
from kernel.progress import JobProgress, ProgressBars
from kernel.samples import KeptSample
from kernel.spec import JobSpec
from kernel.summary import SUMMARY_METRICS, FirstLast, JobSummary, summarize
from kernel.team_view import in_team_words, masked_spec, weights_name


@dataclass(frozen=True)
class RunInfo:
    """What a sink may want to know before the first step."""

    spec: JobSpec
    dataset_size: int
    start_step: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


def shown_spec(spec: JobSpec, team_view: bool) -> dict[str, Any]:
    """The spec as a tracker gets it: with `team_view` (a tracker the team reads, in the
    service), the weights' folders the service filled in named as the team's key sees them."""
    dumped = spec.model_dump(mode="json")
    return masked_spec(dumped) if team_view else dumped


def shown_path(path: str, team_view: bool) -> str:
    """A saved weights' location as a tracker gets it (see `shown_spec`)."""
    return weights_name(path) if team_view else path


class Sink:
    def start(self, info: RunInfo) -> None:
        """The run is about to take its first step (or its first step after a resume)."""

    def step(self, step: int, metrics: dict[str, float]) -> None:
        """Step `step` finished with these metrics (the `eval/` ones of its boundary too)."""

    def eval(self, step: int, metrics: dict[str, float]) -> None:
        """The eval after the last step (`step` = the run's steps), which no step carries."""

    def samples(self, step: int, samples: list[KeptSample]) -> None:
        """A few of step `step`'s rollouts, kept for people to read."""

    def checkpoint(self, step: int, kind: str, path: str) -> None:
        """Weights were saved after `step` steps; kind is state, sampler or final."""

    def event(self, level: str, message: str, data: dict[str, Any] | None = None) -> None:
        """Something a person may want to see in the job's timeline."""

    def progress(self, progress: JobProgress) -> None:
        """What the run does now (a step, an eval prompt by prompt) and the time left."""

    def close(self) -> None:
        """The run ended (success, stop or failure); flush and release resources."""

    async def settled(self) -> None:
        """Return once what decides the next step boundary has landed: the loop waits for
        it before it asks whether to stop (the service's sink, while the job's team has
        a budget, for the step just recorded and its spending checked)."""

    async def may_spend(self, tokens: int) -> bool:
        """Whether an eval that may count `tokens` fits what the job may still spend (the
        service's sink asks its team's budget); else the loop skips it."""
        return True


class FanOut(Sink):
    """Sends every call to each sink in order."""

    def __init__(self, *sinks: Sink) -> None:
        self.sinks = list(sinks)

    def start(self, info: RunInfo) -> None:
        for sink in self.sinks:
            sink.start(info)

    def step(self, step: int, metrics: dict[str, float]) -> None:
        for sink in self.sinks:
            sink.step(step, metrics)

    def eval(self, step: int, metrics: dict[str, float]) -> None:
        for sink in self.sinks:
            sink.eval(step, metrics)

    def samples(self, step: int, samples: list[KeptSample]) -> None:
        for sink in self.sinks:
            sink.samples(step, samples)

    def checkpoint(self, step: int, kind: str, path: str) -> None:
        for sink in self.sinks:
            sink.checkpoint(step, kind, path)

    def event(self, level: str, message: str, data: dict[str, Any] | None = None) -> None:
        for sink in self.sinks:
            sink.event(level, message, data)

    def progress(self, progress: JobProgress) -> None:
        for sink in self.sinks:
            sink.progress(progress)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()

    async def settled(self) -> None:
        for sink in self.sinks:
            await sink.settled()

    async def may_spend(self, tokens: int) -> bool:
        return all([await sink.may_spend(tokens) for sink in self.sinks])


def step_line(step: int, steps: int, metrics: dict[str, float]) -> str:
    """The reference scripts' per-step line."""
    return (
        f"step {step:03d}/{steps} | datums {int(metrics['data/datums'])} | "
        f"completion tokens mean {metrics['data/completion_tokens_mean']:.1f} | "
        f"tokens/s {metrics['data/completion_tokens_per_second']:.1f} | "
        f"reverse_kl {metrics['opd/reverse_kl_mean']:.4f} | "
        f"time {metrics['time/step_elapsed_time']:.2f}s"
    )


def eval_line(step: int, metrics: dict[str, float]) -> str | None:
    """The held-out eval of a boundary, when `metrics` holds one."""
    shown = {
        name.removeprefix("eval/"): value
        for name, value in metrics.items()
        if name.startswith("eval/")
    }
    if not shown:
        return None
    return f"eval after {step} steps | " + " | ".join(
        f"{name} {value:.4f}" for name, value in shown.items()
    )


class InTeamWords(FanOut):
    """A sink that hears the run say paths as the team wrote them: trackers get the spec as
    stored (a relative `teacher.model_path` as written, not the data-root folder the worker
    resolved it to), and events name each resolved path of `words` in the team's words."""

    def __init__(self, sink: Sink, written: JobSpec, words: dict[str, str]) -> None:
        super().__init__(sink)
        self.written, self.words = written, words

    def start(self, info: RunInfo) -> None:
        super().start(replace(info, spec=self.written))

    def event(self, level: str, message: str, data: dict[str, Any] | None = None) -> None:
        super().event(level, in_team_words(message, self.words), in_team_words(data, self.words))


class ConsoleSink(Sink):
    """The job's bars (`ProgressBars`: steps with the time left, an eval's prompts while it
    runs) plus the reference's per-step line."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.bars: ProgressBars | None = None
        self.steps = 0

    def start(self, info: RunInfo) -> None:
        self.steps = info.spec.loop.steps
        self.bars = ProgressBars(info.spec.name, self.steps, self.stream, info.start_step)

    def step(self, step: int, metrics: dict[str, float]) -> None:
        self.write(step_line(step, self.steps, metrics))
        self.eval(step, metrics)
        if self.bars is not None:
            self.bars.figure(REVERSE_KL, f"{metrics[REVERSE_KL]:.4f}")
            self.bars.steps(step + 1)

    def eval(self, step: int, metrics: dict[str, float]) -> None:
        if line := eval_line(step, metrics):
            self.write(line)

    def progress(self, progress: JobProgress) -> None:
        if self.bars is not None:
            self.bars.show(progress)

    def event(self, level: str, message: str, data: dict[str, Any] | None = None) -> None:
        self.write(f"[{level}] {message}")

    def write(self, line: str) -> None:
        tqdm.write(line, file=self.stream)

    def close(self) -> None:
        if self.bars is not None:
            self.bars.close()
            self.bars = None


class JsonlSink(Sink):
    """One JSON object per step: {"step": n, ...metrics}; appends, so resumes extend it."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.file = self.path.open("a", encoding="utf-8")

    def step(self, step: int, metrics: dict[str, float]) -> None:
        self.file.write(json.dumps({"step": step, **metrics}) + "\n")
        self.file.flush()

    def eval(self, step: int, metrics: dict[str, float]) -> None:
        self.step(step, metrics)

    def close(self) -> None:
        self.file.close()


class SwanLabSink(Sink):
    """Logs to SwanLab as the reference scripts do (same metric names and tags)."""

    def __init__(self, log_dir: str | Path, team_view: bool = False) -> None:
        self.log_dir = Path(log_dir)
        self.team_view = team_view
        """Weights' folders named as a team's key sees them (`shown_spec`): the service."""
        self.run: Any = None

    def start(self, info: RunInfo) -> None:
        import swanlab

        spec = info.spec
        config = shown_spec(spec, self.team_view) | {"dataset_size": info.dataset_size}
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.run = swanlab.init(
            project=spec.swanlab.project,
            name=spec.name,
            workspace=spec.swanlab.workspace,
            mode=spec.swanlab.mode,
            config=config,
            tags=[
                "TRIO",
                "OPD",
                *dict.fromkeys(share.source for share in spec.dataset_shares()),
                spec.backend,
            ],
            log_dir=str(self.log_dir),
        )

    def step(self, step: int, metrics: dict[str, float]) -> None:
        if self.run is not None:
            self.run.log(metrics, step=step)

    def eval(self, step: int, metrics: dict[str, float]) -> None:
        self.step(step, metrics)

    def checkpoint(self, step: int, kind: str, path: str) -> None:
        if self.run is not None and kind == "final":
            import swanlab

            shown = shown_path(path, self.team_view)
            self.run.log({"save/weights_path": swanlab.Text(shown)}, step=step)

    def close(self) -> None:
        if self.run is not None:
            self.run.finish()
            self.run = None


class SummarySink(Sink):
    """Keeps the first and last value of the metrics a job summary shows (`opd run`)."""

    def __init__(self) -> None:
        self.first_last: dict[str, FirstLast] = {}

    def step(self, step: int, metrics: dict[str, float]) -> None:
        for name in SUMMARY_METRICS.values():
            if name in metrics:
                first = self.first_last.get(name, (metrics[name], None))[0]
                self.first_last[name] = (first, metrics[name])

    def eval(self, step: int, metrics: dict[str, float]) -> None:
        self.step(step, metrics)

    def summary(self) -> JobSummary:
        return summarize(self.first_last)
