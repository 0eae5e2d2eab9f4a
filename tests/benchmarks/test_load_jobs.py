"""benchmarks/load_jobs.py, shrunk: it exercises the deliberate retries, finds nothing lost
or duplicated, and leaves no database, queue, process or file behind, Ctrl-C included.
Timings are not asserted: they depend on the machine."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import psycopg
from redis import Redis

from tests.support import POSTGRES_ADMIN_URL, REDIS_URL

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "load_jobs.py"
LOAD_REDIS_URL = REDIS_URL.rsplit("/", 1)[0] + "/12"
SERVICES = ("--postgres", POSTGRES_ADMIN_URL, "--redis", LOAD_REDIS_URL)
SMALL_LOAD = ("--jobs", "30", "--clients", "5", "--workers", "1", "--timeout", "10")
RETRIES = ("--repeat-share", "0.2", "--abandon-share", "0.1", "--cancel-share", "0.1")
DEPLOYMENT = re.compile(r"Postgres database (\S+), queue (\S+) on .*, OPD_HOME (\S+)")


def script(*args: str) -> list[str]:
    return [sys.executable, str(SCRIPT), *SERVICES, *args]


def figure(pattern: str, output: str) -> int:
    match = re.search(pattern, output)
    assert match, f"{pattern!r} not in:\n{output}"
    return int(match.group(1))


def assert_nothing_left(output: str) -> None:
    """The database is dropped, the queue's keys deleted, OPD_HOME removed, and no process
    serves the queue any more."""
    match = DEPLOYMENT.search(output)
    assert match, output
    database, queue, home = match.groups()
    with psycopg.connect(POSTGRES_ADMIN_URL) as conn:
        found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,))
        assert found.fetchone() is None
    with Redis.from_url(LOAD_REDIS_URL) as redis:
        assert list(redis.scan_iter(match=f"*{queue}*")) == []
    assert not Path(home).exists()
    assert not [pid for pid in os.listdir("/proc") if serves(pid, queue)]


def serves(pid: str, queue: str) -> bool:
    try:
        return f"OPD_QUEUE_NAME={queue}".encode() in Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:  # not a process, gone, or not ours to read
        return False


def test_small_load_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    run = subprocess.run(
        script(*SMALL_LOAD, *RETRIES),
        env=os.environ | {"TMPDIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = run.stdout + run.stderr
    assert run.returncode == 0, output
    assert figure(r"(\d+) of 30 jobs accepted", output) == 30
    assert figure(r"(\d+) jobs sent twice at once", output) > 0
    assert figure(r"(\d+) requests abandoned before their answer", output) > 0
    assert figure(r"Duplicated: (\d+) ", output) == 0
    assert figure(r"(\d+) rows in the jobs table", output) == 30
    assert figure(r"Lost: (\d+) ", output) == 0
    assert "PASS" in output
    assert_nothing_left(output)


def test_ctrl_c_stops_and_removes_everything(tmp_path: Path) -> None:
    process = subprocess.Popen(
        script("--jobs", "20", "--clients", "2", "--workers", "1"),
        env=os.environ | {"TMPDIR": str(tmp_path)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert process.stdout is not None
    seen = []
    for line in process.stdout:
        seen.append(line)
        if line.startswith("Waiting up to"):
            process.send_signal(signal.SIGINT)
            break
    output = "".join(seen) + process.communicate(timeout=120)[0]
    assert process.returncode == 130, output
    assert_nothing_left(output)


def test_bad_option_is_explained() -> None:
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "--cancel-share", "2"], capture_output=True, text=True
    )
    assert run.returncode == 2
    assert "--cancel-share: 2 is not a share between 0 and 1" in run.stderr
