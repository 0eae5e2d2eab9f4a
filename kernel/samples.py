"""The rollouts a job keeps for people to read: what one holds, and how many a job keeps.

A job keeps `loop.keep_samples` rollouts on the steps `keeps_samples` picks, spread evenly
over the run so that no job keeps more than MAX_SAMPLES_PER_JOB; each is cut to
MAX_SAMPLE_TOKENS tokens (and its prompt to MAX_PROMPT_CHARS characters).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MAX_SAMPLES_PER_JOB = 2_000
MAX_SAMPLE_TOKENS = 2_048
MAX_PROMPT_CHARS = 4_000


@dataclass(frozen=True)
class KeptSample:
    prompt: str
    completion: str
    tokens: list[str]
    """The completion's tokens, decoded one by one."""
    reverse_kl: list[float]
    """student - teacher logprob of each kept token."""
    truncated: bool = False


def keeps_samples(step: int, total_steps: int, per_step: int) -> bool:
    """Whether step `step` keeps rollouts: every step while the job's total stays within
    MAX_SAMPLES_PER_JOB, else every n-th step."""
    if per_step == 0:
        return False
    stride = max(1, math.ceil(total_steps * per_step / MAX_SAMPLES_PER_JOB))
    return step % stride == 0
