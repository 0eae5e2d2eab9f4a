"""benchmarks/fleet.py, shrunk: a worker holding running jobs and an API process are killed
mid-run, nothing is lost, every figure is reported, and the processes keep to the pools
they were given (with the default pools this fleet opened 29 connections). Timings are not
asserted: they depend on the machine."""

from __future__ import annotations

import json
from pathlib import Path

from tests.benchmarks.scripts import run_benchmark
from tests.support import REDIS_URL

SMALL = ("--apis", "2", "--workers", "2", "--jobs", "16", "--teams", "4", "--dashboards", "8")
FAST = ("--steps", "2", "--latency", "0.2", "--poll-seconds", "1")
POOLS = ("--db-pool-size", "1", "--db-max-overflow", "0")
OWN_CONNECTIONS = 2
"""The benchmark's own, besides its sampler's: the dashboards' job finder and the killer."""


def test_a_small_fleet_loses_nothing_when_a_worker_and_an_api_die(tmp_path: Path) -> None:
    figures = tmp_path / "fleet.json"
    redis = REDIS_URL.rsplit("/", 1)[0] + "/12"
    done = run_benchmark(
        "fleet.py", *SMALL, *FAST, *POOLS, "--redis-url", redis, "--json", str(figures),
        tmp_path=tmp_path, timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(figures.read_text())
    assert result["lost"] == []
    assert result["jobs"]["statuses"] == {"succeeded": 16}
    assert result["jobs"]["wrong_steps"] == []
    assert sorted(name.split("-")[0] for name in result["killed"]) == ["api", "worker"]
    assert result["submit"]["accepted"] >= 16
    for figure in (
        result["jobs"]["dispatch_per_second"],
        result["jobs"]["wait_p99_s"],
        result["postgres"]["commits_per_second"],
        result["postgres"]["cpu_percent"],
        result["dashboards"]["p99_ms"],
        result["rss_mib"]["worker_max"],
    ):
        assert figure is not None and figure >= 0
    assert result["postgres"]["commits_per_second"] > 0
    assert result["connection_ceiling"] == (2 + 2 * 2) * 1
    assert result["postgres"]["peak_connections"] <= result["connection_ceiling"] + OWN_CONNECTIONS
    assert result["dashboards"]["reads"] > 0
    assert "nothing lost" in done.stdout and "dashboards:" in done.stdout
    assert not list(tmp_path.glob("opd-fleet-*")), "the deployment's folder was left behind"
