"""benchmarks/grader_speed.py grades a small realistic set and reports both figures. Timings
are not asserted: they depend on the machine."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "grader_speed.py"


def test_reports_cold_start_steady_speed_and_the_verdicts() -> None:
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "--answers", "40", "--workers", "1"],
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert run.returncode == 0, run.stderr
    assert re.search(
        r"^cold start: the pool \(workers=1\) started .* in [\d.]+ s$", run.stdout, re.M
    )
    assert re.search(
        r"^steady state: 40 answers in [\d.]+ s = [\d.]+ answers/s \(workers=1\)$", run.stdout, re.M
    )
    counts = re.search(r"^verdicts: (.*)$", run.stdout, re.M)
    assert counts is not None
    # The set mixes right, wrong and boxless answers, and every one of the 40 is counted.
    graded = dict(item.rsplit(" ", 1) for item in counts.group(1).split(", "))
    assert {"correct", "wrong", "no_answer"} <= graded.keys()
    assert sum(map(int, graded.values())) == 40
