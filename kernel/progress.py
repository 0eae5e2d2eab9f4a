"""What a running job is doing now, as its engine says it: a training step or a held-out
eval (and how far the eval has got), and the time left at the pace so far, evals included.
`opd run` shows it as it comes; a worker writes it with the job's heartbeat, and the API,
`opd watch` and the dashboard show it."""

from __future__ import annotations

import math
from enum import StrEnum
from typing import TextIO

from pydantic import BaseModel, Field, computed_field
from tqdm import tqdm


class Phase(StrEnum):
    training = "training"
    evaluating = "evaluating"


class JobProgress(BaseModel):
    phase: Phase
    step: int = Field(
        description="Training: the step being trained (from 0). Evaluating: the steps done "
        "before the eval."
    )
    eval_done: int | None = Field(
        None, description="Evaluating: the held-out prompts answered so far (every sample)."
    )
    eval_total: int | None = Field(
        None,
        description="Evaluating: the prompts this eval answers (the teacher's baseline's too, "
        "at step 0).",
    )
    eta_seconds: float | None = Field(
        None,
        description="Seconds left at the pace so far: the steps to go at the recent step time, "
        "and each eval to go (this one's rest included) at the eval's time per prompt; null "
        "until a step and an eval have been timed.",
    )

    @computed_field(
        description="The same in words: `training step 3`, `evaluating after "
        "step 0: 12/40 prompts`."
    )
    @property
    def doing(self) -> str:
        return self.line()

    def line(self) -> str:
        """`evaluating after step 0: 12/40 prompts` or `training step 3`."""
        if self.phase is Phase.evaluating:
            return f"evaluating after step {self.step}: {self.eval_done}/{self.eval_total} prompts"
        return f"training step {self.step}"


def duration(seconds: float | None) -> str:
    """`42s`, `3m 05s`, `2h 07m`, `3d 4h`; an empty string for unknown."""
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return ""
    whole = int(seconds)
    if whole < 60:
        return f"{whole}s"
    minutes, secs = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes}m {secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h {minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d {hours}h"


class ProgressBars:
    """What `opd run` and `opd watch` show of a job: a bar over its steps with its figures
    and the time left (the run's own estimate, evals included: tqdm's counts steps only),
    and, while a held-out eval runs, a second bar over the eval's prompts."""

    STEPS = "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]"

    def __init__(self, desc: str, total: int, stream: TextIO, initial: int = 0) -> None:
        self.stream = stream
        self.figures: dict[str, str] = {}
        self.bar = tqdm(
            total=total,
            initial=initial,
            desc=desc,
            unit="step",
            file=stream,
            dynamic_ncols=True,
            bar_format=self.STEPS,
        )
        self.eval_bar: tqdm | None = None

    def steps(self, done: int, desc: str | None = None) -> None:
        if desc is not None:
            self.bar.set_description_str(desc, refresh=False)
        self.bar.set_postfix(self.figures, refresh=False)
        self.bar.update(min(done, self.bar.total) - self.bar.n)
        self.bar.refresh()

    def figure(self, name: str, value: str) -> None:
        """A figure shown after the bar (`opd/reverse_kl_mean=0.4213`)."""
        self.figures[name] = value

    def show(self, progress: JobProgress | None) -> None:
        """What the run does now: the time left, and an eval's prompts on their own bar."""
        left = duration(progress.eta_seconds if progress else None)
        if left:
            self.figures["left"] = left
        else:
            self.figures.pop("left", None)
        evaluating = progress is not None and progress.phase is Phase.evaluating
        if evaluating and progress is not None:
            if self.eval_bar is None:
                self.eval_bar = tqdm(
                    total=progress.eval_total,
                    desc=f"held-out eval after step {progress.step}",
                    unit="prompt",
                    file=self.stream,
                    dynamic_ncols=True,
                    leave=False,
                    position=1,
                )
            self.eval_bar.update((progress.eval_done or 0) - self.eval_bar.n)
            self.eval_bar.refresh()
        elif self.eval_bar is not None:
            self.eval_bar.close()
            self.eval_bar = None
        self.bar.set_postfix(self.figures)

    def write(self, line: str, stream: TextIO | None = None) -> None:
        """A line above the bars, which stays as they move on."""
        self.bar.write(line, file=stream or self.stream)

    def close(self) -> None:
        if self.eval_bar is not None:
            self.eval_bar.close()
        self.bar.close()
