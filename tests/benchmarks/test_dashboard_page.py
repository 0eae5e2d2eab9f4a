"""benchmarks/dashboard_page.py runs end to end on a short job, reports every figure and
leaves nothing behind. Timings are not asserted: they depend on the machine."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "dashboard_page.py"
SMALL = ("--steps", "40", "--requests", "2")


@pytest.mark.skipif(not Path("/usr/bin/chromium").exists(), reason="needs Debian's chromium")
def test_reports_server_time_and_page_weight(tmp_path: Path) -> None:
    figures_file = tmp_path / "figures.json"
    # The benchmark's temporary home goes to TMPDIR: a short one, since Chromium's profile
    # socket must fit a unix socket path (108 bytes), which the test's own folder may not
    # under pytest-xdist.
    with tempfile.TemporaryDirectory(prefix="opd-") as short:
        run = subprocess.run(
            [sys.executable, str(SCRIPT), *SMALL, "--json", str(figures_file)],
            env=os.environ | {"TMPDIR": short, "PYTHONPATH": str(ROOT)},
            capture_output=True,
            text=True,
            timeout=180,
        )
        left_behind = list(Path(short).iterdir())
    assert run.returncode == 0, run.stderr
    for name in ("job page \\(HTML\\)", "jobs table \\(HTML\\)", "chart curves \\(JSON\\)"):
        assert re.search(rf"{name} +p50 [\d.]+ ms, p95 [\d.]+ ms", run.stdout), run.stdout
    assert re.search(r"page weight \(first load, Chromium\): [\d.]+ KB", run.stdout)
    figures = json.loads(figures_file.read_text())
    urls = [resource["url"] for resource in figures["weight"]["resources"]]
    assert "/ui/jobs/1" in urls and "/ui/static/uplot/uPlot.iife.min.js" in urls
    assert any(url.startswith("/v1/jobs/1/metrics?") for url in urls), "the charts' curves"
    assert figures["weight"]["reverse_kl_points"] == 40
    assert left_behind == [], "the temporary home was left behind"
