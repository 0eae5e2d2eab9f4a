"""benchmarks/loop_speed.py runs the real loop at a tiny scale and reports every figure.
Timings are not asserted: they depend on the machine. The staleness figures are not
timings: k steps off policy trains on rollouts exactly k steps old once the pipeline is full."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.benchmarks.scripts import run_benchmark
from tests.support import assert_close

TINY = (
    *("--steps", "5", "--tokens", "32", "--cpu-steps", "3", "--cpu-rollouts", "8"),
    *("--cpu-tokens", "64", "--refresh", "0.01", "--sample", "0.02", "--teacher", "0.005"),
    *("--forward-backward", "0.015", "--optim", "0.002"),
)
NUMBER = r"[\d.]+"


def test_reports_the_three_loops_the_loop_cpu_and_the_targets(tmp_path: Path) -> None:
    figures_file = tmp_path / "figures.json"

    run = run_benchmark(
        "loop_speed.py", *TINY, "--json", str(figures_file), tmp_path=tmp_path, timeout=240
    )

    assert run.returncode == 0, run.stderr
    for k, staleness in ((0, "0.00 / 0"), (1, "1.00 / 1"), (2, "2.00 / 2")):
        row = rf"^{k} +{NUMBER} s +{NUMBER}x +{NUMBER}x +{staleness} +{NUMBER} s$"
        assert re.search(row, run.stdout, re.M), f"no row for k = {k} in:\n{run.stdout}"
    assert re.search(
        rf"^loop CPU per step at zero latency, 8 x 64-token rollouts: {NUMBER} ms = "
        rf"{NUMBER}% of a 30 s step$",
        run.stdout,
        re.M,
    ), run.stdout
    assert re.search(
        r"^targets: .*k = 1 at least 1.45x faster than k = 0: (met|MISSED)", run.stdout, re.M
    )
    figures = json.loads(figures_file.read_text())
    assert_close([figures["bound_seconds"]], [0.052])
    assert [s["k"] for s in figures["speeds"]] == [0, 1, 2]
    assert [s["staleness_max"] for s in figures["speeds"]] == [0, 1, 2]
    assert figures["loop_cpu_seconds_per_step"] > 0
