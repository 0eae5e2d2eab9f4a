"""benchmarks/chaos_soak.py, shrunk to 12 jobs of 10 steps, 2 sweeps of 4 trials (one
cancelled midway), 1 job taught by the service's own /v1, the uploads (a burst over the
quota, malicious files) and 6 faults in 45 s (a worker killed -9, the worker controlling
a sweep killed -9, Redis restarted empty, Postgres restarted, Postgres away longer than
the heartbeat timeout, the object store cut off): every check holds, and nothing is left
behind. The table's figures are asserted, not its timings."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.benchmarks.scripts import BENCHMARKS

JOBS, SWEEPS, SERVED = 12, 2, 1
SHORT = ("--jobs", str(JOBS), "--sweeps", str(SWEEPS), "--served", str(SERVED))
SHORT += ("--minutes", "0.75", "--steps", "10")
KINDS = "kill-worker,kill-controller,restart-redis,restart-postgres,outage-postgres,outage-store"
FAULTS = ("--faults", "6", "--kinds", KINDS)


def count(label: str, output: str) -> int:
    match = re.search(rf"^  {re.escape(label)} +(\d+)", output, re.M)
    assert match, f"{label!r} not in:\n{output}"
    return int(match.group(1))


def compared_values(noun: str, output: str) -> int:
    found = re.search(rf"^  {noun} values differing .+ bit for bit +0 +(\d+)  PASS$", output, re.M)
    assert found, f"{noun} values not compared:\n{output}"
    return int(found.group(1))


def test_a_short_soak_keeps_every_promise() -> None:
    run = subprocess.run(  # TMPDIR stays /tmp: the postgres user must reach the cluster's folder
        [sys.executable, str(BENCHMARKS / "chaos_soak.py"), *SHORT, *FAULTS],
        env=os.environ,
        capture_output=True,
        text=True,
        timeout=900,
    )

    output = run.stdout
    assert run.returncode == 0, output + run.stderr[-5000:]
    assert count("kill -9 a worker (restarted after 0-10 s)", output) == 1
    assert count("kill -9 a sweep controller's worker (restarted 0-10 s)", output) == 1
    assert count("restart Redis empty", output) == 1
    assert count("restart Postgres (immediate stop)", output) == 1
    assert count("Postgres away 20 s (past the heartbeat timeout)", output) == 1
    assert count("cut the object store off for 5-15 s", output) == 1
    # The clients' jobs, the served ones and the job that serves them.
    assert count("succeeded", output) + count("cancelled", output) == JOBS + SERVED + 1
    assert count("sweeps completed", output) + count("sweeps cancelled", output) == SWEEPS
    assert "workers killed while controlling a sweep 1" in output, "the controller was killed"
    checks = re.findall(r"^  .+? +(\d+) +[\d-]+  (PASS|FAIL)$", output, re.M)
    assert len(checks) == 25 and all(verdict == "PASS" for _, verdict in checks), output
    assert compared_values("job", output) > 1000, "the jobs' curves were compared"
    assert compared_values("trial", output) > 100, "the trials' curves were compared"
    assert re.search(r"^  server-taught job step rows .+ 0 +1  PASS$", output, re.M), output
    assert re.search(r"^  uploads answered neither 201 nor a 4xx +0 +13  PASS$", output, re.M)
    assert "PASS: every check held" in output
    folders = re.search(r"^Deployment: OPD_HOME (\S+), Postgres (\S+), Redis (\S+)$", output, re.M)
    assert folders, output
    assert not any(Path(folder).exists() for folder in folders.groups()), "folders left behind"
