"""Running a benchmark script as a maintainer would, with its temporary files under
`tmp_path` (so a test can check that nothing was left behind)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def run_benchmark(
    script: str, *args: str, tmp_path: Path, timeout: float
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(BENCHMARKS / script), *args],
        env=os.environ | {"TMPDIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
