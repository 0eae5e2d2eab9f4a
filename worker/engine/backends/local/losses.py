"""PyTRIO's (and Tinker's) training losses as pure per-token torch functions.

Each returns the loss of every token position; the trainer sums them over tokens and
datums without normalising, as both services do.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

PPO_CLIP_LOW = 0.2
PPO_CLIP_HIGH = 0.2


def importance_sampling(logprobs: Tensor, inputs: dict[str, Tensor]) -> Tensor:
    """-ratio * advantage, ratio = p_new / p_sampler."""
    ratio = torch.exp(logprobs - inputs["logprobs"])
    return -ratio * inputs["advantages"]


def ppo(logprobs: Tensor, inputs: dict[str, Tensor]) -> Tensor:
    """The clipped surrogate: -min(ratio * A, clip(ratio, 0.8, 1.2) * A)."""
    ratio = torch.exp(logprobs - inputs["logprobs"])
    advantages = inputs["advantages"]
    clipped = torch.clamp(ratio, 1 - PPO_CLIP_LOW, 1 + PPO_CLIP_HIGH)
    return -torch.minimum(ratio * advantages, clipped * advantages)


def cross_entropy(logprobs: Tensor, inputs: dict[str, Tensor]) -> Tensor:
    """-weight * logprob of the target token (weights default to 1)."""
    return -inputs["weights"] * logprobs


LOSSES: dict[str, Callable[[Tensor, dict[str, Tensor]], Tensor]] = {
    "importance_sampling": importance_sampling,
    "ppo": ppo,
    "cross_entropy": cross_entropy,
}
