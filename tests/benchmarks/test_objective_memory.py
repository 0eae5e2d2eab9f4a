"""benchmarks/objective_memory.py trains every objective on a random model with a large
vocabulary and reports each one's step time and peak memory. Timings are not asserted:
they depend on the machine."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.benchmarks.scripts import run_benchmark

OBJECTIVES = ("sampled_reverse_kl", "forward_kl top-64", "direct")


def test_reports_step_time_and_peak_memory_of_each_objective(tmp_path: Path) -> None:
    out = tmp_path / "figures.json"
    settings = ("--vocab", "20000", "--rows", "2", "--completion", "16", "--steps", "1")
    run = run_benchmark(
        "objective_memory.py",
        *settings,
        "--only",
        *OBJECTIVES,
        "--json",
        str(out),
        tmp_path=tmp_path,
        timeout=300,
    )

    assert run.returncode == 0, run.stderr
    assert "vocabulary 20000, 2 x 16 completion positions (32)" in run.stdout
    for name in OBJECTIVES:
        assert re.search(rf"^{re.escape(name)} +[\d.]+ +[\d.]+ +\d+ +[\d.]+$", run.stdout, re.M), (
            name,
            run.stdout,
        )
    figures = json.loads(out.read_text())["figures"]
    assert set(figures) == set(OBJECTIVES)
    assert all(row["step_seconds"] > 0 and row["peak_mib"] > 0 for row in figures.values())
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("opd-objective-memory-")]
