"""benchmarks/curve_reads.py runs end to end at a tiny scale, reports every figure and leaves
nothing behind. Timings are not asserted: they depend on the machine."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from tests.benchmarks.scripts import run_benchmark

TINY = (
    *("--databases", "sqlite,postgres", "--sizes", "40,300", "--long-steps", "2500"),
    *("--waiting-jobs", "12", "--duration", "1", "--warmup", "0.5", "--dashboards", "4"),
    *("--repeats", "3", "--write-steps", "12"),
)
LINES = (
    r"300 steps: p50 / p99 \(ms\) +[\d.]+ / [\d.]+ +[\d.]+ / [\d.]+",
    r"1,000-point curve p50 / p99 \(ms\) +[\d.]+ / [\d.]+ +[\d.]+ / [\d.]+",
    r"export CSV \(s / MB\) +[\d.]+ / [\d.]+ +[\d.]+ / [\d.]+",
    r"  p50 \(ms\) +[\d.]+ / [\d.]+ / [\d.]+ +[\d.]+ / [\d.]+ / [\d.]+",
    r"summaries alone, p50 ratio +[\d.]+x +[\d.]+x",
    r"requeuing pass over 12 waiting jobs \(ms\) +[\d.]+ +[\d.]+",
    r"postgres: 1,000-point curve <= 20 ms: (met|NOT met) \([\d.]+ ms\)",
)


def run_script(*args: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return run_benchmark("curve_reads.py", *args, tmp_path=tmp_path, timeout=240)


def test_reports_every_figure_on_both_databases(tmp_path: Path) -> None:
    figures_file = tmp_path / "figures.json"
    run = run_script(*TINY, "--json", str(figures_file), tmp_path=tmp_path)

    assert run.returncode == 0, run.stderr
    for line in LINES:
        assert re.search(line, run.stdout), f"no line matching {line!r} in:\n{run.stdout}"
    figures = json.loads(figures_file.read_text())
    for name in ("sqlite", "postgres"):
        load = figures[name]["dashboard_load"]
        assert set(load) == {"40", "300"}
        assert all(phase["requests"] > 0 and phase["errors"] == 0 for phase in load.values())
        long_job = figures[name]["long_job"]
        assert long_job["downsampling"]["method"] == "minmax"
        assert 900 <= long_job["curve"]["points"] <= 1000
        assert long_job["export_csv"]["lines"] == 2501, "a header and every step"
        assert long_job["export_jsonl"]["lines"] == 2500
        assert long_job["unchanged_poll"]["bytes"] == 0, "a 304 has no body"
        writes = figures[name]["record_step"]
        assert all(writes[name]["p50_ms"] > 0 for name in ("before", "store", "after"))
        assert figures[name]["requeue"] == figures[name]["requeue"] | {"jobs": 12, "sent": 0}
    assert list(tmp_path.iterdir()) == [figures_file], "the temporary home was left behind"


def test_bad_arguments_are_refused_before_anything_starts(tmp_path: Path) -> None:
    run = run_script("--databases", "mysql", tmp_path=tmp_path)
    assert run.returncode == 2
    assert "sqlite, postgres or both" in run.stderr
