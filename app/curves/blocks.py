"""Summaries of a metric over aligned blocks of steps: what a chart reads (pure).

Each metric of a job is summarised over blocks of 4, 16, 64, ... 16,384 steps (block `i`
of width `w` holds steps `i*w .. i*w + w - 1`): how many points, the first and the last
point, and the min and the max with their steps, so no spike is lost however coarse the
block. A block is summarised once it is complete: when a step past it is recorded. The
block holding the newest step stays open; readers cover it with finer blocks and step rows.
Null values (a NaN or infinity when recorded) count as points and can be a first or last
point, but never a min or max.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

FANOUT = 4
WIDTHS = tuple(FANOUT**level for level in range(1, 8))  # 4 .. 16,384 steps


class Summary(NamedTuple):
    """A tuple, as cheap to make as the rows it comes from (charts read thousands)."""

    points: int
    first_step: int
    first_value: float | None
    last_step: int
    last_value: float | None
    min_step: int | None = None
    min_value: float | None = None
    max_step: int | None = None
    max_value: float | None = None

    @classmethod
    def point(cls, step: int, value: float | None) -> Summary:
        if value is None:
            return cls(1, step, None, step, None)
        return cls(1, step, value, step, value, step, value, step, value)


@dataclass(frozen=True, slots=True)
class BlockSummary:
    """One metric's summary over block `index` of `width` steps."""

    key: str
    width: int
    index: int
    summary: Summary

    def row(self, job_id: int) -> dict[str, Any]:
        """The `metric_summaries` row."""
        return {
            "job_id": job_id,
            "key": self.key,
            "width": self.width,
            "block": self.index,
            **self.summary._asdict(),
        }


def merge(parts: Iterable[Summary]) -> Summary:
    """The summary of adjacent parts (at least one); ties keep the earlier step."""
    parts = list(parts)
    first = min(parts, key=lambda p: p.first_step)
    last = max(parts, key=lambda p: p.last_step)
    valued = [p for p in parts if p.min_value is not None]
    low = min(valued, key=lambda p: (p.min_value, p.min_step), default=None)
    high = max(valued, key=lambda p: (p.max_value, -(p.max_step or 0)), default=None)
    return Summary(
        points=sum(p.points for p in parts),
        first_step=first.first_step,
        first_value=first.first_value,
        last_step=last.last_step,
        last_value=last.last_value,
        min_step=low.min_step if low else None,
        min_value=low.min_value if low else None,
        max_step=high.max_step if high else None,
        max_value=high.max_value if high else None,
    )


def merge_by_key(groups: Iterable[Mapping[str, Summary]]) -> dict[str, Summary]:
    """Per metric, the merge of its parts across `groups`."""
    parts: dict[str, list[Summary]] = {}
    for group in groups:
        for key, summary in group.items():
            parts.setdefault(key, []).append(summary)
    return {key: merge(found) for key, found in parts.items()}


def points_of(metrics: Mapping[str, float | None], step: int) -> dict[str, Summary]:
    return {key: Summary.point(step, value) for key, value in metrics.items()}


def closed_by(step: int, newest: int | None) -> list[tuple[int, int]]:
    """The (width, index) blocks that recording `step` completes, finest first: those
    holding the previous newest step, when `step` lies past them."""
    if newest is None or step <= newest:
        return []
    return [(w, newest // w) for w in WIDTHS if newest // w < step // w]


def complete_holding(step: int, newest: int) -> list[tuple[int, int]]:
    """The complete (width, index) blocks that hold `step`, finest first: to summarise
    again when a replayed step's values changed."""
    return [(w, step // w) for w in WIDTHS if step // w < newest // w]


def complete_blocks(
    rows: Iterable[tuple[int, Mapping[str, float | None]]],
) -> Iterator[BlockSummary]:
    """Every complete block's summary per metric, from a job's step rows in step order
    (what recording those steps one by one leaves in the store)."""
    index: list[int | None] = [None] * len(WIDTHS)
    open_blocks: list[dict[str, Summary]] = [{} for _ in WIDTHS]
    for step, metrics in rows:
        for level, width in enumerate(WIDTHS):
            if index[level] == step // width:
                break  # wider blocks hold this step's block too
            done, current = open_blocks[level], index[level]
            if done and current is not None:
                for key, summary in done.items():
                    yield BlockSummary(key, width, current, summary)
                if level + 1 < len(WIDTHS):
                    parent = open_blocks[level + 1]
                    open_blocks[level + 1] = merge_by_key([parent, done])
            index[level], open_blocks[level] = step // width, {}
        open_blocks[0] = merge_by_key([open_blocks[0], points_of(metrics, step)])
