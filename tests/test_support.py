"""The suite's float comparison: rounding noise passes, a real difference fails."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.support import assert_close


def test_noise_on_tiny_entries_passes_where_element_wise_checks_fail():
    expected = torch.tensor([11.0, -3.0, 1e-7, 0.0])
    actual = expected + torch.tensor([1e-5, -1e-5, 1e-5, 1e-5])
    assert not torch.allclose(actual, expected, rtol=1e-4, atol=1e-6)
    assert_close(actual, expected, rtol=1e-4)


def test_a_real_difference_fails_and_says_by_how_much():
    expected = np.array([1.0, 2.0, 3.0])
    with pytest.raises(AssertionError, match=r"largest element difference 0\.1"):
        assert_close(expected + np.array([0.0, 0.1, 0.0]), expected, what="grads")
    with pytest.raises(AssertionError, match="shape"):
        assert_close([1.0, 2.0], expected)
