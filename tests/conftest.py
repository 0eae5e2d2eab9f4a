"""The suite runs on two xdist workers (scripts/test.sh). Tests that start processes,
browsers or servers of their own share one worker and run there one after another: two at
once would fight over the CPU their heartbeats and timings need, and over Chromium.

The grouping is a scheduler of our own rather than `xdist_group` marks: pytest 9.2 no
longer lets xdist 3.8 put a mark's group into the test's id, so those marks group nothing
(pytest-dev/pytest-xdist#1386)."""

from __future__ import annotations

from typing import Any

import pytest
from xdist.scheduler import LoadScopeScheduling

ONE_AT_A_TIME = ("tests/e2e/", "tests/benchmarks/")


class ProcessesOnOneWorker(LoadScopeScheduling):
    """`--dist loadgroup` with one group: every test under ONE_AT_A_TIME is one work unit,
    every other test a unit of its own."""

    def _split_scope(self, nodeid: str) -> str:
        return "processes" if nodeid.startswith(ONE_AT_A_TIME) else nodeid


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> LoadScopeScheduling | None:
    return ProcessesOnOneWorker(config, log) if config.getvalue("dist") == "loadgroup" else None
