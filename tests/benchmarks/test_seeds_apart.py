"""The real-model benchmarks run each seed in a process of its own (three SmolLM2 seeds in
one process grew past 18 GB and the OOM killer ended the run). Here, with a seed that
loads no model, that each seed runs in another process, that the untrained figures the
first measured reach the next (or those of a kept run, --untrained), that --json holds
every finished seed, and that a seed's process ends when the run that sent it is killed."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.benchmarks.scripts import BENCHMARKS

sys.path.insert(0, str(BENCHMARKS))

from real_model import benchmark_parser, benchmark_run, each_seed_apart


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


async def a_long_seed(
    args: argparse.Namespace, seed: int, before: dict[str, Any] | None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A seed that says where it runs and then takes minutes, as a model's seed does."""
    args.json.write_text(str(os.getpid()))
    await asyncio.sleep(300)
    return {}, {}


RUN_LONG = f"""
import argparse, asyncio, sys
from pathlib import Path
sys.path.insert(0, {str(BENCHMARKS)!r})
from real_model import each_seed_apart
from tests.benchmarks.test_seeds_apart import a_long_seed
args = argparse.Namespace(first_seed=1, seeds=1, json=Path(sys.argv[1]))
asyncio.run(each_seed_apart(args, {{"before": None, "seeds": []}}, a_long_seed))
"""


def ended(pid: int) -> bool:
    """Whether the process is gone or a zombie (nobody here need reap it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_a_seed_ends_when_its_run_is_killed(tmp_path: Path) -> None:
    said = tmp_path / "seed.pid"
    run = subprocess.Popen([sys.executable, "-c", RUN_LONG, str(said)], cwd=BENCHMARKS.parent)
    try:
        deadline = time.monotonic() + 120
        while not (said.exists() and said.read_text()) and time.monotonic() < deadline:
            time.sleep(0.2)
        seed = int(said.read_text())
        assert not ended(seed)
    finally:
        run.kill()
        run.wait()
    deadline = time.monotonic() + 30
    while not ended(seed) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ended(seed), "the seed's process outlived the run that sent it"


def test_a_kept_runs_untrained_figures_reach_the_seeds(tmp_path: Path) -> None:
    """--untrained: the seeds get a kept run's untrained figures and measure none again."""
    kept = tmp_path / "kept.json"
    kept.write_text(json.dumps({"before": {"measured_in": 1}, "seeds": []}))
    args = benchmark_parser(None, [], "").parse_args(
        ["--seeds", "1", "--untrained", str(kept), "--json", str(tmp_path / "new.json")]
    )

    async def run_all(args: argparse.Namespace, figures: dict[str, Any]) -> None:
        await each_seed_apart(args, figures, a_seed)

    assert benchmark_run(args, "a run", {}, run_all, lambda figures: ([], True)) == 0

    figures = json.loads((tmp_path / "new.json").read_text())
    assert figures["before"] == {"measured_in": 1}
    assert figures["seeds"][0]["seed"] == 1
