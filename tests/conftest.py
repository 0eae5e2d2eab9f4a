"""The suite runs on two xdist workers (scripts/test.sh). Tests that start processes,
browsers or servers of their own share one worker and run there one after another: two at
once would fight over the CPU their heartbeats and timings need, and over Chromium."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ONE_AT_A_TIME = (HERE / "e2e", HERE / "benchmarks")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if any(item.path.is_relative_to(folder) for folder in ONE_AT_A_TIME):
            item.add_marker(pytest.mark.xdist_group("processes"))
