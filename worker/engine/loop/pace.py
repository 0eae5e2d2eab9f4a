"""A run's pace: how long its steps take and its evals take a prompt, and so what it is
doing now (`JobProgress`) with the time left, evals included: the time a user waits for is
mostly evals on a real model (a held-out eval of 40 prompts can outlast ten steps)."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from kernel.progress import JobProgress, Phase
from kernel.spec import EvalSpec
from worker.engine.eval.evaluation import due

RECENT_STEPS = 20
"""Steps whose mean time paces the steps to go."""


@dataclass
class Pace:
    total_steps: int
    eval_spec: EvalSpec | None
    eval_size: Callable[[int], int]
    """The prompts the eval after a step answers (`Evaluation.size`)."""
    clock: Callable[[], float] = time.monotonic
    step_seconds: deque[float] = field(default_factory=lambda: deque(maxlen=RECENT_STEPS))
    prompt_seconds: float | None = None
    """An eval's seconds per prompt, the latest eval's to end."""
    eval_started: float = 0.0

    def evals_after(self, step: int) -> int:
        """The prompts the evals after `step` steps answer, to the run's end."""
        if self.eval_spec is None:
            return 0
        return sum(
            self.eval_size(boundary)
            for boundary in range(step + 1, self.total_steps + 1)
            if due(self.eval_spec, boundary, self.total_steps)
        )

    def eta(self, steps_left: int, prompts_left: int, rate: float | None = None) -> float | None:
        """Seconds for `steps_left` steps and `prompts_left` eval prompts (`rate`: seconds a
        prompt, else the latest eval's); None where either has not been timed yet."""
        rate = self.prompt_seconds if rate is None else rate
        if (steps_left and not self.step_seconds) or (prompts_left and rate is None):
            return None
        per_step = sum(self.step_seconds) / len(self.step_seconds) if self.step_seconds else 0.0
        return steps_left * per_step + prompts_left * (rate or 0.0)

    def training(self, step: int) -> JobProgress:
        eta = self.eta(self.total_steps - step, self.evals_after(step))
        return JobProgress(phase=Phase.training, step=step, eta_seconds=eta)

    def trained(self, seconds: float) -> None:
        self.step_seconds.append(seconds)

    def evaluating(self, step: int, done: int) -> JobProgress:
        """The eval after `step` steps, `done` of its prompts answered (paced, before any
        eval ended, by this one's time per prompt so far)."""
        total = self.eval_size(step)
        now = self.clock()
        if done == 0:
            self.eval_started = now
        rate = self.prompt_seconds
        if rate is None and done:
            rate = (now - self.eval_started) / done
        left = total - done + self.evals_after(step)
        eta = self.eta(self.total_steps - step, left, rate)
        return JobProgress(
            phase=Phase.evaluating, step=step, eval_done=done, eval_total=total, eta_seconds=eta
        )

    def evaluated(self, step: int) -> float:
        """The eval after `step` steps ended: its seconds (its time per prompt paces the
        evals to go)."""
        seconds = self.clock() - self.eval_started
        self.prompt_seconds = seconds / max(1, self.eval_size(step))
        return seconds
