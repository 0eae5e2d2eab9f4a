"""benchmarks/api_load.py runs end to end at a tiny load, reports every figure and leaves
nothing behind. Timings are not asserted: they depend on the machine."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from tests.benchmarks.scripts import run_benchmark

TINY_LOAD = ("--duration", "2", "--warmup", "0.5", "--dashboards", "10", "--clients", "4")
LATENCIES = ("p50_ms", "p99_ms", "max_ms")
TABLE_ROWS = (
    r"p50 latency \(ms\) +[\d.]+ +[\d.]+ +[\d.]+x",
    r"p99 latency \(ms\) +[\d.]+ +[\d.]+ +[\d.]+x",
    r"achieved rate \(req/s\) +[\d.]+ +[\d.]+",
    r"throughput \(req/s\) +[\d.]+ +[\d.]+ +[\d.]+x",
    r"p50 / p99 latency \(ms\) +[\d.]+ / [\d.]+ +[\d.]+ / [\d.]+",
    r"record_step on sqlite \(\d+ metrics; \d+ steps at [\d.]+/s\): p50 [\d.]+ ms, p99 [\d.]+ ms",
    r"target p99 < 50 ms at 20 req/s: (met|NOT met) \([\d.]+ ms\)",
)


def run_script(*args: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return run_benchmark("api_load.py", *args, tmp_path=tmp_path, timeout=120)


def test_reports_every_figure_for_both_servers(tmp_path: Path) -> None:
    figures_file = tmp_path / "figures.json"
    run = run_script(*TINY_LOAD, "--json", str(figures_file), tmp_path=tmp_path)

    assert run.returncode == 0, run.stderr
    for row in TABLE_ROWS:
        assert re.search(row, run.stdout), f"no line matching {row!r} in:\n{run.stdout}"
    figures = json.loads(figures_file.read_text())
    for server in ("ours", "baseline"):
        open_loop, closed_loop = figures[server]["open_loop"], figures[server]["closed_loop"]
        assert open_loop["offered_rps"] == 20
        assert open_loop["requests"] > 0 and closed_loop["requests"] > 0
        assert open_loop["errors"] == open_loop["unfinished"] == 0
        assert closed_loop["errors"] == closed_loop["unfinished"] == 0
        assert all(phase[name] > 0 for phase in (open_loop, closed_loop) for name in LATENCIES)
        assert open_loop["achieved_rps"] > 0 and closed_loop["rps"] > 0
    writes = figures["record_step"]
    assert writes["steps"] > 0 and writes["metrics_per_step"] >= 13
    assert all(writes[name] > 0 for name in LATENCIES)
    assert list(tmp_path.iterdir()) == [figures_file], "the temporary home was left behind"


def test_unreachable_redis_is_a_clear_error(tmp_path: Path) -> None:
    run = run_script("--redis-url", "redis://127.0.0.1:1/0", tmp_path=tmp_path)

    assert run.returncode == 1
    assert "Redis at redis://127.0.0.1:1/0 does not answer" in run.stderr
    assert "--redis-url" in run.stderr and "Traceback" not in run.stderr
