"""Evenly downsampled metric curves."""

from __future__ import annotations

from itertools import pairwise

import pytest

from app.curves import build_curves, downsample_indices


@pytest.mark.parametrize("count", [0, 1, 2, 5, 10])
def test_short_curves_are_kept_whole(count):
    assert downsample_indices(count, 10) == list(range(count))


@pytest.mark.parametrize(("count", "max_points"), [(11, 10), (100, 7), (1001, 2), (100_000, 999)])
def test_long_curves_keep_first_last_and_even_spacing(count, max_points):
    kept = downsample_indices(count, max_points)
    assert len(kept) == max_points
    assert kept[0] == 0 and kept[-1] == count - 1
    assert kept == sorted(set(kept))
    gaps = [b - a for a, b in pairwise(kept)]
    assert max(gaps) - min(gaps) <= 1


def test_fewer_than_two_points_is_refused():
    with pytest.raises(ValueError, match="at least 2"):
        downsample_indices(5, 1)


def test_build_curves_per_key():
    rows = [(0, {"a": 1.0, "b": 2.0}), (1, {"a": None}), (3, {"a": 3.0, "b": 4.0})]
    curves = build_curves(rows, None, max_points=10)
    assert curves["a"].steps == [0, 1, 3] and curves["a"].values == [1.0, None, 3.0]
    assert curves["b"].steps == [0, 3]
    only = build_curves(rows, ["b", "zzz"], max_points=10)
    assert list(only) == ["b", "zzz"] and only["zzz"].steps == []
    assert build_curves(rows, ["a"], max_points=2)["a"].steps == [0, 3]
