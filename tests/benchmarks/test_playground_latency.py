"""benchmarks/playground_latency.py runs end to end on a few requests, reports each
figure and leaves nothing behind. Timings are not asserted: they depend on the machine."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.benchmarks.scripts import run_benchmark


def test_reports_warm_cold_and_first_request_latency(tmp_path: Path) -> None:
    figures_file = tmp_path / "figures.json"
    run = run_benchmark(
        "playground_latency.py",
        *("--warm", "3", "--cold", "2", "--max-tokens", "8", "--json", str(figures_file)),
        tmp_path=tmp_path,
        timeout=300,
    )

    assert run.returncode == 0, run.stderr
    for name in ("warm", "cold", "first after start"):
        assert re.search(
            rf"^{name} +n=\d+ +p50 [\d.]+ ms, p99 [\d.]+ ms \(worker", run.stdout, re.M
        )
    figures = json.loads(figures_file.read_text())
    assert (figures["warm"]["requests"], figures["cold"]["requests"]) == (3, 2)
    assert list(tmp_path.iterdir()) == [figures_file], "the temporary home was left behind"
