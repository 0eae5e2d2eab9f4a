"""The OPD datum and advantage helpers, against examples worked out by hand."""

from __future__ import annotations

import numpy as np
import pytest

from kernel.errors import BackendFailure
from worker.engine.data.mixing import batch_indices
from worker.engine.rollouts.datums import build_opd_datum, completion_slice, kl_advantages


def test_datum_is_shifted_for_next_token_prediction_and_padded_over_the_prompt() -> None:
    datum = build_opd_datum(
        prompt_ids=[11, 12, 13],
        completion_ids=[21, 22, 23, 24],
        old_logprobs=[-0.5, -1.0, -1.5, -2.0],
        advantages=np.array([0.25, -0.25, 0.5, -0.5]),
    )

    assert datum.model_input.to_ints() == [11, 12, 13, 21, 22, 23]
    inputs = datum.loss_fn_inputs
    assert inputs["target_tokens"].data == [0, 0, 21, 22, 23, 24]
    assert inputs["logprobs"].data == [0.0, 0.0, -0.5, -1.0, -1.5, -2.0]
    assert inputs["advantages"].data == [0.0, 0.0, 0.25, -0.25, 0.5, -0.5]
    assert inputs["target_tokens"].dtype == "int64"
    assert inputs["logprobs"].dtype == "float32"
    assert inputs["advantages"].dtype == "float32"
    assert all(tensor.shape == [6] for tensor in inputs.values())


def test_one_token_prompt_needs_no_padding() -> None:
    datum = build_opd_datum([7], [8, 9], [-1.0, -2.0], [1.0, 2.0])

    assert datum.model_input.to_ints() == [7, 8]
    assert datum.loss_fn_inputs["target_tokens"].data == [8, 9]


def test_mismatched_logprobs_are_refused() -> None:
    with pytest.raises(ValueError, match="same length"):
        build_opd_datum([1, 2], [3, 4], [-1.0], [0.0, 0.0])


def test_student_more_confident_than_teacher_gets_a_negative_advantage() -> None:
    reverse_kl, advantages = kl_advantages([-0.1, -3.0], [-2.0, -1.0], kl_penalty_coef=2.0)

    assert reverse_kl.tolist() == pytest.approx([1.9, -2.0])
    assert advantages.tolist() == pytest.approx([-3.8, 4.0])


def test_discount_factor_adds_discounted_future_advantages() -> None:
    # reverse_kl = [1, 0, -1], so the per-token advantages are [-1, 0, 1]; with gamma 0.5:
    # a0 = -1 + 0.5*0 + 0.25*1, a1 = 0 + 0.5*1, a2 = 1.
    reverse_kl, advantages = kl_advantages(
        [-1.0, -1.0, -1.0], [-2.0, -1.0, 0.0], kl_penalty_coef=1.0, kl_discount_factor=0.5
    )

    assert reverse_kl.tolist() == [1.0, 0.0, -1.0]
    assert advantages.tolist() == pytest.approx([-0.75, 0.5, 1.0])


def test_zero_discount_is_the_reference_per_token_advantage() -> None:
    _, advantages = kl_advantages([-1.0, -1.0], [-2.0, 0.0], 1.0, kl_discount_factor=0.0)

    assert advantages.tolist() == [-1.0, 1.0]


def test_batch_indices_wrap_around_the_pool() -> None:
    assert batch_indices(step=0, batch_size=3, pool_size=7) == [0, 1, 2]
    assert batch_indices(step=2, batch_size=3, pool_size=7) == [6, 0, 1]
    assert batch_indices(step=1, batch_size=4, pool_size=2) == [0, 1, 0, 1]


def test_completion_slice_needs_one_value_per_completion_token() -> None:
    assert completion_slice([None, -1.0, -2.0, -3.0], prompt_len=2, n=2) == [-2.0, -3.0]
    with pytest.raises(BackendFailure, match="Invalid teacher logprobs"):
        completion_slice([None, -1.0, -2.0, None], prompt_len=2, n=2)
    with pytest.raises(BackendFailure, match="Invalid teacher logprobs"):
        completion_slice([None, -1.0, -2.0], prompt_len=2, n=2)
