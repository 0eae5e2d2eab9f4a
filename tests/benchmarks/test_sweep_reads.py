"""benchmarks/sweep_reads.py runs end to end on a small sweep, reports each figure and
leaves nothing behind. Timings are not asserted: they depend on the machine."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.benchmarks.scripts import run_benchmark


def test_reports_the_reads_and_the_controllers_passes(tmp_path: Path) -> None:
    figures_file = tmp_path / "figures.json"
    args = ("--trials", "12", "--steps", "40", "--repeats", "2", "--json", str(figures_file))
    run = run_benchmark("sweep_reads.py", *args, tmp_path=tmp_path, timeout=240)

    assert run.returncode == 0, run.stderr
    for label in (r"GET /v1/sweeps/\{id\}", "GET /v1/sweeps"):
        assert re.search(rf"^{label} +p50 [\d.]+ ms, p99 [\d.]+ ms", run.stdout, re.M)
    assert re.search(r"^controller pass +first [\d.]+ ms, next [\d.]+ ms", run.stdout, re.M)
    figures = json.loads(figures_file.read_text())
    assert (figures["trials"], figures["detail"]["requests"]) == (12, 2)
    assert list(tmp_path.iterdir()) == [figures_file], "the temporary home was left behind"
