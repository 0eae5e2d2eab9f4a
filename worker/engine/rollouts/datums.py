"""Small pure helpers of the OPD algorithm: advantages and datums.

These reproduce the reference scripts exactly (docs/algorithm.md#the-datum): the datum is
shifted for next-token prediction and padded with zeros over the prompt.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from pytrio.types import Datum, ModelInput, TensorData

from kernel.errors import BackendFailure
from worker.engine.backends.contract import TopK


def completion_slice(all_logprobs: Sequence[float | None], prompt_len: int, n: int) -> list[float]:
    """The teacher's logprobs of the completion tokens; each must be present."""
    completion = all_logprobs[prompt_len:]
    if len(completion) != n or any(value is None for value in completion):
        raise BackendFailure(
            "Invalid teacher logprobs for completion tokens: expected one value per token",
            code="bad_teacher_logprobs",
        )
    return [float(value) for value in completion]


"""The teacher's k likeliest tokens at one position as (token, logprob), likeliest first."""


def completion_topk(all_topk: Sequence[TopK | None], prompt_len: int, n: int, k: int) -> list[TopK]:
    """The teacher's top k at each completion position, each present, padded to k entries
    with (0, -inf) where fewer came back (a vocabulary smaller than k)."""
    completion = all_topk[prompt_len:]
    if len(completion) != n or any(not row or len(row) > k for row in completion):
        raise BackendFailure(
            f"Invalid teacher top-{k} logprobs for completion tokens: expected 1 to {k} "
            "(token, logprob) pairs per token",
            code="bad_teacher_logprobs",
        )
    padding = [(0, -math.inf)]
    return [[(int(t), float(v)) for t, v in row] + padding * (k - len(row)) for row in completion]


def discounted_future_sum(values: np.ndarray, gamma: float) -> np.ndarray:
    """out[t] = sum_{k >= t} gamma**(k - t) * values[k]."""
    out = np.zeros_like(values, dtype=np.float64)
    running = 0.0
    for t in range(len(values) - 1, -1, -1):
        running = values[t] + gamma * running
        out[t] = running
    return out


def kl_advantages(
    student_logprobs: Sequence[float],
    teacher_logprobs: Sequence[float],
    kl_penalty_coef: float,
    kl_discount_factor: float = 0.0,
) -> tuple[np.ndarray, np.ndarray]:
    """Return (reverse_kl, advantages) per completion token.

    reverse_kl = student - teacher; advantage = -coef * reverse_kl, optionally replaced
    by its discounted future sum as tinker-cookbook does (factor 0 = the reference).
    """
    reverse_kl = np.asarray(student_logprobs, dtype=np.float64) - np.asarray(
        teacher_logprobs, dtype=np.float64
    )
    advantages = -kl_penalty_coef * reverse_kl
    if kl_discount_factor > 0:
        advantages = discounted_future_sum(advantages, kl_discount_factor)
    return reverse_kl, advantages


def build_opd_datum(
    prompt_ids: Sequence[int],
    completion_ids: Sequence[int],
    old_logprobs: Sequence[float],
    advantages: Sequence[float] | np.ndarray,
    *,
    weighted: bool = False,
    teacher_topk: Sequence[TopK] | None = None,
) -> Datum:
    """One training datum: input = prompt + completion[:-1], targets shifted by one;
    `weighted` adds `weights`, 1 at the completion positions a logit-level objective
    compares and 0 on the prompt; `teacher_topk` (k pairs per completion token) adds the
    teacher's distribution there for a trainer that never sees the teacher (Tinker's
    forward_kl): `teacher_tokens` and `teacher_probs`, [length, k], 0 on the prompt."""
    pad = len(prompt_ids) - 1
    input_ids = list(prompt_ids) + list(completion_ids[:-1])
    target_ids = [0] * pad + list(completion_ids)
    padded_logprobs = [0.0] * pad + [float(v) for v in old_logprobs]
    padded_advantages = [0.0] * pad + [float(v) for v in advantages]
    if not len(input_ids) == len(target_ids) == len(padded_logprobs) == len(padded_advantages):
        raise ValueError("OPD datum fields must have the same length")
    # TensorData made here is checked once; an array given to Datum is checked twice.
    inputs = {
        "target_tokens": TensorData.from_numpy(np.asarray(target_ids, dtype=np.int64)),
        "logprobs": TensorData.from_numpy(np.asarray(padded_logprobs, dtype=np.float32)),
        "advantages": TensorData.from_numpy(np.asarray(padded_advantages, dtype=np.float32)),
    }
    if weighted:
        weights = np.concatenate([np.zeros(pad), np.ones(len(completion_ids))])
        inputs["weights"] = TensorData.from_numpy(weights.astype(np.float32))
    if teacher_topk is not None:
        inputs |= teacher_inputs(pad, teacher_topk)
    return Datum(model_input=ModelInput.from_ints(input_ids), loss_fn_inputs=inputs)


def teacher_inputs(pad: int, topk: Sequence[TopK]) -> dict[str, TensorData]:
    """`teacher_tokens` (int64) and `teacher_probs` (float32), [pad + len(topk), k]: the
    teacher's top k at each completion position, zeros on the `pad` prompt positions."""
    width = len(topk[0])
    tokens = np.zeros((pad + len(topk), width), dtype=np.int64)
    probs = np.zeros((pad + len(topk), width), dtype=np.float64)
    tokens[pad:] = [[token for token, _ in row] for row in topk]
    probs[pad:] = np.exp([[logprob for _, logprob in row] for row in topk])
    return {
        "teacher_tokens": TensorData.from_numpy(tokens),
        "teacher_probs": TensorData.from_numpy(probs.astype(np.float32)),
    }
