"""Where a run stands between steps: the stop asked for, the state saved to resume from,
what a run ends with, and the step a resumed run starts at.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum

from kernel.errors import OPDError
from kernel.spec import JobSpec, LoopSpec
from worker.engine.loop.schedule import resume_versions


class Stop(Enum):
    """A stop asked for at the next step boundary. `resume` (a pause, a worker shutting
    down) saves a state to resume from, and with k >= 1 trains on until a resumed run can
    sample the same rollouts; `cancel` ends the run at the very next boundary, the last
    one included, with its state (another job may continue from it) and no sampler
    weights: the run never resumes."""

    resume = "resume"
    cancel = "cancel"


@dataclass(frozen=True)
class SavedState:
    """A training state a run can resume from, and the steps it had taken."""

    path: str
    step: int
    samplers: Mapping[int, str] = field(default_factory=dict)
    """With max_steps_off_policy >= 1: saved sampler weights by the steps they had taken,
    those the steps after `step` sample from (more may be given)."""


@dataclass(frozen=True)
class RunResult:
    steps_done: int
    stopped: bool = False
    final_weights_path: str | None = None
    state: SavedState | None = None


def state_name(spec: JobSpec, steps_done: int) -> str:
    return f"{spec.weights_name}-state-{steps_done:06d}"


def first_step(loop: LoopSpec, resume: SavedState | None) -> int:
    """The step a run starts at: 0, or a saved state's, if the run can resume there
    exactly (with k >= 1 that needs the older sampler weights its next steps sample from)."""
    start = resume.step if resume else 0
    if not 0 <= start <= loop.steps:
        raise OPDError(
            f"cannot resume at step {start}: the run has {loop.steps} steps",
            code="bad_resume_state",
        )
    needed = resume_versions(start, loop) if resume and loop.max_steps_off_policy else set()
    if missing := sorted(needed - resume.samplers.keys() if resume else needed):
        raise OPDError(
            f"cannot resume at step {start}: its next steps sample from the sampler weights "
            f"saved after steps {missing}, which were not given",
            code="bad_resume_state",
        )
    return start


def checkpoint_due(loop: LoopSpec, done: int) -> bool:
    """Whether `loop.save_every` saves a checkpoint after `done` steps (the last boundary
    saves its own final weights)."""
    return bool(loop.save_every) and done % loop.save_every == 0 and done < loop.steps
