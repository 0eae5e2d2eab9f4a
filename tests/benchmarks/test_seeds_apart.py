"""The real-model benchmarks run each seed in a process of its own (three SmolLM2 seeds in
one process grew past 18 GB and the OOM killer ended the run). Here, with a seed that
loads no model, that each seed runs in another process, that the untrained figures the
first measured reach the next, and that --json holds every finished seed."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from tests.benchmarks.scripts import BENCHMARKS

sys.path.insert(0, str(BENCHMARKS))

from real_model import each_seed_apart


async def a_seed(
    args: argparse.Namespace, seed: int, before: dict[str, Any] | None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """What a seed's run returns: the untrained figures (its own when none came) and its
    row, each naming the process it ran in."""
    return before or {"measured_in": os.getpid()}, {"seed": seed, "pid": os.getpid()}


def test_each_seed_runs_in_a_process_of_its_own(tmp_path: Path) -> None:
    kept = tmp_path / "figures.json"
    args = argparse.Namespace(first_seed=2, seeds=2, json=kept)
    figures: dict[str, Any] = {"before": None, "seeds": []}

    asyncio.run(each_seed_apart(args, figures, a_seed))

    assert [row["seed"] for row in figures["seeds"]] == [2, 3]
    pids = {row["pid"] for row in figures["seeds"]}
    assert len(pids) == 2 and os.getpid() not in pids
    assert figures["before"] == {"measured_in": figures["seeds"][0]["pid"]}
    assert json.loads(kept.read_text()) == figures
