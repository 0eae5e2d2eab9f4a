"""Block summaries: min, max, first and last per block, built once a block is complete."""

from __future__ import annotations

import random

import pytest

from app.curves.blocks import (
    WIDTHS,
    BlockSummary,
    Summary,
    closed_by,
    complete_blocks,
    complete_holding,
    merge,
)


def brute_force(rows: list[tuple[int, dict[str, float | None]]], key: str, width: int, index: int):
    """The block's summary computed directly from its points."""
    points = [(s, m[key]) for s, m in rows if key in m and s // width == index]
    valued = [(v, s) for s, v in points if v is not None]
    low = min(valued) if valued else (None, None)
    high = max(valued, key=lambda p: (p[0], -p[1])) if valued else (None, None)
    return Summary(
        len(points), points[0][0], points[0][1], points[-1][0], points[-1][1],
        low[1], low[0], high[1], high[0],
    )  # fmt: skip


def test_merge_keeps_extremes_with_their_steps_and_skips_nulls():
    parts = [Summary.point(0, 1.0), Summary.point(1, None), Summary.point(2, 5.0)]
    parts += [Summary.point(3, -2.0), Summary.point(4, 5.0), Summary.point(5, None)]
    merged = merge(reversed(parts))
    assert merged == Summary(6, 0, 1.0, 5, None, 3, -2.0, 2, 5.0), "ties keep the earlier step"
    assert merge([Summary.point(7, None)]) == Summary(1, 7, None, 7, None)


def test_a_step_past_the_newest_completes_the_blocks_that_held_it():
    assert closed_by(0, None) == []
    assert closed_by(3, 2) == []
    assert closed_by(4, 3) == [(4, 0)]
    assert closed_by(16, 15) == [(4, 3), (16, 0)]
    assert closed_by(100, 9) == [(4, 2), (16, 0), (64, 0)]
    assert closed_by(5, 9) == [], "not past the newest: a replay"


def test_a_replayed_step_touches_only_complete_blocks_holding_it():
    assert complete_holding(5, 9) == [(4, 1)]
    assert complete_holding(9, 9) == []
    assert complete_holding(17, 200) == [(4, 4), (16, 1), (64, 0)]


@pytest.mark.parametrize("steps", [0, 1, 3, 4, 5, 64, 1000, 17_000])
def test_complete_blocks_equal_a_brute_force_summary(steps):
    noise = random.Random(steps)
    rows = []
    for step in range(steps):
        metrics: dict[str, float | None] = {"kl": noise.gauss(0, 1)}
        if step % 7 == 0:
            metrics["eval"] = None if step % 21 == 0 else noise.random()
        rows.append((step, metrics))
    blocks = list(complete_blocks(rows))
    newest = steps - 1
    expected_blocks = {
        (key, width, index)
        for width in WIDTHS
        for index in range(max(newest, 0) // width)
        for key in ("kl", "eval")
        if any(key in m for s, m in rows[index * width : (index + 1) * width])
    }
    assert {(b.key, b.width, b.index) for b in blocks} == expected_blocks
    for block in blocks[:: max(1, len(blocks) // 300)]:
        assert block.summary == brute_force(rows, block.key, block.width, block.index), block


def test_gaps_in_the_steps_still_complete_blocks_once_passed():
    rows = [(0, {"a": 1.0}), (1, {"a": 3.0}), (9, {"a": 2.0})]
    assert list(complete_blocks(rows)) == [
        BlockSummary("a", 4, 0, Summary(2, 0, 1.0, 1, 3.0, 0, 1.0, 1, 3.0))
    ]
