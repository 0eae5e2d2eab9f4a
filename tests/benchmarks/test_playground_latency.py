"""benchmarks/playground_latency.py runs end to end on a few requests, reports each
figure (warm while the worker controls two small sweeps too) and leaves nothing behind.
Timings are not asserted: they depend on the machine."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.benchmarks.scripts import run_benchmark

SMALL = (
    *("--warm", "3", "--cold", "2", "--max-tokens", "8"),
    *("--sweeps", "2", "--trials", "6", "--sweep-steps", "60"),
)


def test_reports_latency_idle_and_while_controlling_sweeps(tmp_path: Path) -> None:
    figures_file = tmp_path / "figures.json"
    run = run_benchmark(
        "playground_latency.py", *SMALL, "--json", str(figures_file), tmp_path=tmp_path, timeout=400
    )

    assert run.returncode == 0, run.stderr
    for name in ("warm", "cold", "first after start", "warm, sweeps"):
        assert re.search(
            rf"^{name} +n=\d+ +p50 [\d.]+ ms, p99 [\d.]+ ms \(worker", run.stdout, re.M
        ), run.stdout
    assert re.search(r"^heartbeats every 1 s: idle \d+ beats", run.stdout, re.M), run.stdout
    assert re.search(r"^p99 with sweeps / idle: [\d.]+x; target <= 2x", run.stdout, re.M)
    figures = json.loads(figures_file.read_text())
    assert (figures["warm"]["requests"], figures["cold"]["requests"]) == (3, 2)
    loaded = figures["sweeps"]["warm"]
    assert loaded["requests"] == 3 and loaded["steps_written"] > 0
    assert loaded["judgments_before"] + loaded["judgments_meanwhile"] > 0
    assert list(tmp_path.iterdir()) == [figures_file], "the temporary home was left behind"
