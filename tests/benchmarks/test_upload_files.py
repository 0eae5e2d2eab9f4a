"""benchmarks/upload_files.py runs end to end on a small file, reports its figures and
leaves nothing behind. Timings are not asserted: they depend on the machine."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.benchmarks.scripts import run_benchmark


def test_reports_upload_throughput_and_the_apis_memory(tmp_path: Path) -> None:
    figures_file = tmp_path / "figures.json"
    run = run_benchmark(
        "upload_files.py", "--mb", "2", "--json", str(figures_file), tmp_path=tmp_path, timeout=300
    )
    assert run.returncode == 0, run.stderr
    assert re.search(r"^first: +[\d.]+ s = \d+ MB/s", run.stdout, re.M), run.stdout
    assert re.search(r"^API RSS: \d+ MB idle, \d+ MB peak", run.stdout, re.M), run.stdout
    figures = json.loads(figures_file.read_text())
    assert figures["bytes"] >= 2_000_000 and figures["rows"] > 0
    left = [path for path in tmp_path.iterdir() if path.name.startswith("opd-upload-")]
    assert left == [], "the temporary home was left behind"
