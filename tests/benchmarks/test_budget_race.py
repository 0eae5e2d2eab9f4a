"""benchmarks/budget_race.py, short (4 clients, one job, SQLite): requests and a job racing
at a budget team's limit through two API processes end within one step per job that ran
(8 clients ended about 5 steps past it before requests held their most: see
benchmarks/README.md), with nothing left held and nothing left behind."""

from __future__ import annotations

import json
from pathlib import Path

from tests.benchmarks.scripts import run_benchmark

SHORT = ("--database", "sqlite", "--clients", "4", "--jobs", "1", "--room", "3000")


def test_a_short_race_stays_within_one_step_per_job(tmp_path: Path) -> None:
    figures_file = tmp_path / "figures.json"
    run = run_benchmark(
        "budget_race.py", *SHORT, "--json", str(figures_file), tmp_path=tmp_path, timeout=400
    )

    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.rstrip().endswith("PASS"), run.stdout
    figures = json.loads(figures_file.read_text())
    assert figures["overshoot_tokens"] <= figures["jobs_ran"] * figures["largest_step_tokens"]
    assert figures["held_after"] == 0 and figures["largest_step_tokens"] > 0
    refused = sum(count for name, count in figures["answers"].items() if name.endswith(" 429"))
    assert refused >= 4 * 3  # every client was refused, three times in a row
    assert list(tmp_path.iterdir()) == [figures_file], "the temporary home was left behind"
