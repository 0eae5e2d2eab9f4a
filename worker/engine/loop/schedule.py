"""Which weights sample which step's rollouts: a fixed function of the spec, never of timing.

With `loop.max_steps_off_policy` = k, step t trains on rollouts sampled from the weights
after `sampler_version(t)` optimizer steps: max(t - k, 0) (k = 0: the weights of t's
sampler-refresh block, the reference loop). They are sampled as soon as those weights
exist, while the steps in between train. Because the schedule is decided in advance, a run
is reproducible, and a run resumed at a step boundary needs, beside the training state,
only the older weights its next steps still sample from (`resume_versions`).
"""

from __future__ import annotations

import hashlib

from kernel.spec import LoopSpec


def sampler_version(step: int, loop: LoopSpec) -> int:
    """The optimizer steps taken by the weights whose rollouts step `step` trains on."""
    refresh = loop.sampler_refresh_steps
    return max(step - loop.max_steps_off_policy, 0) // refresh * refresh


def last_step_sampled_by(boundary: int, loop: LoopSpec) -> int:
    """The furthest step whose rollouts may be sampling once `boundary` is reached: k
    steps ahead, and never past the run's last step."""
    return min(boundary + loop.max_steps_off_policy, loop.steps - 1)


def resume_versions(boundary: int, loop: LoopSpec) -> frozenset[int]:
    """The weights older than `boundary` that steps from `boundary` on still sample from:
    a run stopped at `boundary` resumes exactly only with these saved too."""
    versions = set()
    for step in range(boundary, loop.steps):
        version = sampler_version(step, loop)
        if version >= boundary:
            break
        versions.add(version)
    return frozenset(versions)


def kept_for_a_save(version: int, loop: LoopSpec) -> bool:
    """Whether a scheduled state save (every `save_every` steps) resumes from these weights,
    so they must be saved when they are made: a crash resumes from that state."""
    every = loop.save_every
    if not every or not loop.max_steps_off_policy:
        return False
    first = (version // every + 1) * every
    # The last step these weights sample for is version + k + refresh - 1.
    last = min(version + loop.max_steps_off_policy + loop.sampler_refresh_steps - 1, loop.steps - 1)
    return any(version in resume_versions(b, loop) for b in range(first, last + 1, every))


def step_seed(seed: int | None, step: int) -> int | None:
    """A sampling seed of the step's own: with k >= 1 the first k + 1 steps share one set of
    weights, and one seed would draw a prompt that comes back among them identically."""
    if seed is None:
        return None
    digest = hashlib.sha256(f"{seed}:{step}".encode()).digest()
    return int.from_bytes(digest[:4], "big") >> 1
