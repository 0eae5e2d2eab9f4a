"""benchmarks/teacher_tier.py on in-process replicas: every tier size and job count gets its
line, each replica's share and the scaling against one replica. Timings are not asserted."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.benchmarks.scripts import run_benchmark


def test_reports_each_tier_and_job_count_with_the_replicas_shares(tmp_path: Path) -> None:
    out = tmp_path / "figures.json"
    args = ["--servers", "fake", "--replicas", "1,2", "--jobs", "1,2", "--steps", "1"]
    args += ["--prompts", "2", "--group", "2", "--tokens", "16", "--json", str(out)]
    run = run_benchmark("teacher_tier.py", *args, tmp_path=tmp_path, timeout=120)

    assert run.returncode == 0, run.stderr
    lines = re.findall(
        r"^  (\d) job\(s\), (\d) replica\(s\): .* s a step, .*x .*; shares (.*)$", run.stdout, re.M
    )
    assert [(jobs, replicas) for jobs, replicas, _ in lines] == [
        ("1", "1"),
        ("1", "2"),
        ("2", "1"),
        ("2", "2"),
    ]
    figures = json.loads(out.read_text())
    # Requests one at a time or at once go round both replicas alike.
    assert figures["replicas=2 jobs=2"]["shares"] == [0.5, 0.5]
    assert figures["replicas=1 jobs=1"]["scaling"] == 1.0
