"""Chart curves: exact when short, else min/max per bucket from the coarsest blocks."""

from __future__ import annotations

import random

import pytest

from app.curves.blocks import WIDTHS, Summary, complete_blocks
from app.curves.downsampling import Plan, minmax_curve, plan, tile


def test_short_ranges_are_exact():
    assert plan(0, 9, 10) == Plan(0, 9, exact=True)
    assert plan(100, 100, 2).exact


@pytest.mark.parametrize(
    ("span", "max_points", "buckets", "top"),
    [(11, 10, 4, 1), (1_000, 500, 249, 4), (20_000, 500, 249, 64), (100_000, 1000, 499, 64)],
)
def test_long_ranges_are_cut_into_buckets_of_whole_blocks(span, max_points, buckets, top):
    shape = plan(0, span - 1, max_points)
    assert not shape.exact
    assert (shape.buckets, shape.top) == (buckets, top)
    assert 2 * shape.buckets + 2 <= max_points, "min and max per bucket, plus first and last"


def test_two_or_three_points_leave_room_only_for_the_first_and_last():
    assert plan(0, 99, 3).buckets == 0


def covered_steps(runs) -> list[int]:
    return [step for run in runs for step in range(run.start, run.end + 1)]


@pytest.mark.parametrize("seed", range(40))
def test_tiles_cover_the_range_exactly_with_complete_blocks(seed):
    noise = random.Random(seed)
    newest = noise.randrange(0, 70_000)
    first = noise.randrange(0, newest + 1)
    last = noise.randrange(first, newest + 1)
    top = noise.choice((1, *WIDTHS))
    runs = tile(first, last, newest, top)
    assert covered_steps(runs) == list(range(first, last + 1))
    for run in runs:
        assert run.width <= top
        if run.width > 1:
            assert run.first + run.count - 1 < newest // run.width, "only complete blocks"


def test_a_long_job_is_read_in_about_max_points_blocks():
    shape = plan(0, 99_999, 1000)
    runs = tile(0, 99_999, 99_999, shape.top)
    blocks = sum(run.count for run in runs)
    assert 1000 <= blocks <= 1000 * 2, blocks
    assert len(runs) <= 2 * len(WIDTHS) + 1, "a few index ranges, not one per block"


def blocks_of(rows, first: int, last: int, top: int):
    """What the store hands minmax_curve for one metric: a summary per tiled block."""
    newest = rows[-1][0]
    stored = {(b.width, b.index): b.summary for b in complete_blocks(rows) if b.key == "kl"}
    values = dict((step, metrics["kl"]) for step, metrics in rows)
    blocks: list[tuple[int, Summary]] = []
    for run in tile(first, last, newest, top):
        for index in range(run.first, run.first + run.count):
            if run.width == 1:
                blocks.append((index, Summary.point(index, values[index])))
            else:
                blocks.append((index * run.width, stored[(run.width, index)]))
    return blocks


@pytest.mark.parametrize(("steps", "max_points"), [(5_000, 100), (20_000, 500), (3_001, 4)])
def test_spikes_first_and_last_survive_downsampling(steps, max_points):
    noise = random.Random(steps)
    rows = [(s, {"kl": noise.uniform(0.9, 1.1)}) for s in range(steps)]
    spike, dip = noise.randrange(1, steps - 1), noise.randrange(1, steps - 1)
    rows[spike][1]["kl"], rows[dip][1]["kl"] = 50.0, -50.0
    first, last = 1, steps - 2
    shape = plan(first, last, max_points)
    curve = minmax_curve(blocks_of(rows, first, last, shape.top), shape)
    assert len(curve.steps) <= max_points
    assert curve.steps == sorted(set(curve.steps))
    assert curve.steps[0] == first and curve.steps[-1] == last
    recorded = dict((step, metrics["kl"]) for step, metrics in rows)
    assert all(recorded[s] == v for s, v in zip(curve.steps, curve.values, strict=True))
    assert (spike, 50.0) in zip(curve.steps, curve.values, strict=True)
    assert (dip, -50.0) in zip(curve.steps, curve.values, strict=True)


def test_each_bucket_gives_its_min_and_max():
    rows = [(s, {"kl": float(s % 10)}) for s in range(400)]  # a saw: 0..9 every 10 steps
    shape = plan(0, 399, 22)  # 10 buckets of 40 steps
    curve = minmax_curve(blocks_of(rows, 0, 399, shape.top), shape)
    assert curve.values.count(0.0) >= 10 and curve.values.count(9.0) >= 10
