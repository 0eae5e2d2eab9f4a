"""PyTRIO's (and Tinker's) policy losses as pure per-token torch functions.

Each returns the loss of every token position from the new logprobs, the datum's inputs
(sampling `logprobs`, `advantages`) and the loss's options (`loss_fn_config`). The trainer
sums them and divides the gradient as PyTRIO's trainer does (`DENOMINATORS`).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

Loss = Callable[[Tensor, dict[str, Tensor], dict[str, float]], Tensor]


def ratio(logprobs: Tensor, inputs: dict[str, Tensor]) -> Tensor:
    """p_new / p_sampler per token."""
    return torch.exp(logprobs - inputs["logprobs"])


def importance_sampling(logprobs: Tensor, inputs: dict[str, Tensor], _: dict[str, float]) -> Tensor:
    """-ratio * advantage."""
    return -ratio(logprobs, inputs) * inputs["advantages"]


def ppo(logprobs: Tensor, inputs: dict[str, Tensor], options: dict[str, float]) -> Tensor:
    """The clipped surrogate: -min(ratio * A, clip(ratio, low, high) * A)."""
    r = ratio(logprobs, inputs)
    clipped = torch.clamp(r, options["clip_low_threshold"], options["clip_high_threshold"])
    advantages = inputs["advantages"]
    return -torch.minimum(r * advantages, clipped * advantages)


def cispo(logprobs: Tensor, inputs: dict[str, Tensor], options: dict[str, float]) -> Tensor:
    """-sg(clip(ratio, low, high)) * logprob * A: the clipped ratio only weighs the gradient."""
    r = ratio(logprobs, inputs)
    clipped = torch.clamp(r, options["clip_low_threshold"], options["clip_high_threshold"])
    return -clipped.detach() * logprobs * inputs["advantages"]


def dro(logprobs: Tensor, inputs: dict[str, Tensor], options: dict[str, float]) -> Tensor:
    """-(logprob * A - beta / 2 * (logprob - sampling logprob)^2) on the advantage tokens.

    Only tokens with an advantage count, as only they make its denominator: a prompt
    position's sampling logprob is a 0 placeholder, and a penalty towards it would pull every
    prompt token's probability to 1 instead of keeping the policy near its sampler.
    """
    advantages = inputs["advantages"]
    penalty = (logprobs - inputs["logprobs"]) ** 2
    return -(logprobs * advantages - 0.5 * options["beta"] * penalty) * (advantages != 0)


def sampler_gate(logprobs: Tensor, inputs: dict[str, Tensor], kind: str, c: float) -> Tensor:
    """Each token's weight under `loop.sampler_correction` from its ratio r of the trainer's
    probability to the sampler's (a constant of the step: no gradient flows through it):
    mask keeps the tokens with r in [1/c, c] and drops the rest; truncate weighs a token by
    clip(r, 1/c, c) / r, so that the importance-sampling loss's r becomes clip(r). Tokens
    without an advantage (the prompt, whose sampling logprob is a 0 placeholder) keep 1:
    no loss counts them."""
    log_ratio = (logprobs - inputs["logprobs"]).detach()
    bound = math.log(c)
    if kind == "mask":
        gate = (log_ratio.abs() <= bound).to(logprobs.dtype)
    else:
        gate = torch.exp(log_ratio.clamp(-bound, bound) - log_ratio)
    return torch.where(inputs["advantages"] != 0, gate, torch.ones_like(gate))


LOSSES: dict[str, Loss] = {
    "importance_sampling": importance_sampling,
    "ppo": ppo,
    "cispo": cispo,
    "dro": dro,
}
DENOMINATORS = {"dro": "total_advantage_tokens"}
"""Which of PyTRIO's batch totals divides a loss's gradient; the others use
`total_active_tokens` (PyTRIO 0.2.9 sends both with every forward call)."""
