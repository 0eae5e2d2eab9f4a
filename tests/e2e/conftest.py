"""The service as real processes: `opd api` and `opd worker`, on SQLite or Postgres, with
the machine's Redis, driven over HTTP. Fault tests kill and restart these processes."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
import venv
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from redis import Redis
from redis.exceptions import RedisError

from app.jobs.schemas import TERMINAL_STATUSES, EventPublic
from opd.sdk import Client
from opd.serve import free_port
from tests.support import REDIS_URL, temporary_postgres_database

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "examples" / "tiny.yaml"
E2E_REDIS_URL = REDIS_URL.rsplit("/", 1)[0] + "/14"


def tiny_spec(**loop: Any) -> dict[str, Any]:
    """examples/tiny.yaml without its eval, with loop settings overridden."""
    spec = yaml.safe_load(TINY.read_text())
    del spec["eval"]
    spec["loop"] |= loop
    return spec


@dataclass
class Service:
    """One deployment under test: its environment, processes and an authenticated client."""

    home: Path
    env: dict[str, str]
    url: str
    processes: list[subprocess.Popen] = field(default_factory=list)
    key: str = ""

    def opd(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "opd.cli", *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )

    def spawn(self, name: str, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
        log = (self.home / f"{name}-{len(self.processes)}.log").open("ab")
        process = subprocess.Popen(
            [sys.executable, "-m", "opd.cli", *args],
            env=env or self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        self.processes.append(process)
        return process

    def start_api(self, *, quiet: bool = True) -> subprocess.Popen:
        port = self.url.rsplit(":", 1)[1]
        process = self.spawn("api", "api", "--port", port, *(["--quiet"] if quiet else []))
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).is_success:
                    return process
            except httpx.TransportError:
                pass
            assert process.poll() is None, self.logs()
            assert time.monotonic() < deadline, "the API did not start"
            time.sleep(0.2)

    def start_worker(self, **env: str) -> subprocess.Popen:
        return self.spawn("worker", "worker", env=self.env | env)

    def client(self) -> Client:
        return Client(self.url, self.key)

    def curve(self, job_id: int, key: str) -> list[tuple[int, float | None]]:
        with self.client() as client:
            return client.jobs.metrics(job_id, key, max_points=10_000).points(key)

    def events(self, job_id: int) -> list[EventPublic]:
        with self.client() as client:
            return list(client.jobs.events(job_id))

    def submit(self, spec: dict[str, Any]) -> dict[str, Any]:
        response = httpx.post(
            f"{self.url}/v1/jobs",
            json=spec,
            headers={"Authorization": f"Bearer {self.key}"},
            timeout=30,
        )
        assert response.status_code == 201, response.text
        return response.json()

    def wait(self, job_id: int, until: Any = None, timeout: float = 180) -> dict[str, Any]:
        """Poll the job until `until(job)` holds (default: a terminal status)."""
        until = until or (lambda job: job["status"] in TERMINAL_STATUSES)
        deadline = time.monotonic() + timeout
        with self.client() as client:
            while True:
                job = client.jobs.get(job_id).model_dump(mode="json")
                if until(job):
                    return job
                assert time.monotonic() < deadline, f"job stuck: {job}\n{self.logs()}"
                time.sleep(0.25)

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(self.home.glob("*.log"))
        )

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'opd.db'}"
    else:
        with temporary_postgres_database() as url:
            yield url


def team_key(home: Path, database_url: str, team: str, scope: str = "submit") -> str:
    """A key of `team` (a submit key, or of `scope`) in the migrated database, made in this
    process as `opd keys create` makes it (tests/opd/cli tests the command): two processes
    less to start for every deployment, whose imports cost seconds of a shared core."""
    import app.tables  # noqa: F401  (every table in the metadata before a flush)
    from app.auth.keys import create_key
    from app.auth.schemas import Scope
    from app.core.config import Settings
    from app.core.db import migrate, standalone_session

    migrate(database_url, settings=Settings(home=home, database_url=database_url))

    async def make() -> str:
        async with standalone_session(database_url) as session:
            return (await create_key(session, team, scope=Scope(scope))).key

    # A thread of its own: a caller may hold a running event loop (Playwright's sync API).
    with ThreadPoolExecutor(1) as thread:
        return thread.submit(asyncio.run, make()).result()


@contextmanager
def deployment(
    home: Path,
    database_url: str,
    redis_url: str = E2E_REDIS_URL,
    port: int | None = None,
    **settings: str,
) -> Iterator[Service]:
    """A migrated database, an API key and a running API (on `port`, else a free one, for a
    setting that names the API's own URL); fast heartbeats so faults show within seconds.
    Workers are started by the tests."""
    queue = f"opd-e2e-{uuid.uuid4().hex[:12]}"
    env = os.environ | {
        "PYTHONPATH": str(ROOT),
        "OPD_HOME": str(home),
        "OPD_DATABASE_URL": database_url,
        "OPD_REDIS_URL": redis_url,
        "OPD_QUEUE_NAME": queue,
        "OPD_HEARTBEAT_INTERVAL": "0.5",
        "OPD_HEARTBEAT_TIMEOUT": "4",
        "OPD_REQUEUE_INTERVAL": "1",
        "OPD_JOB_CACHE_SECONDS": "0",
        **{f"OPD_{name.upper()}": value for name, value in settings.items()},
    }
    service = Service(home=home, env=env, url=f"http://127.0.0.1:{port or free_port()}")
    service.key = team_key(home, database_url, "e2e")
    service.start_api()
    try:
        yield service
    finally:
        service.stop()
        with contextlib.suppress(RedisError):
            redis = Redis.from_url(redis_url)
            keys = list(redis.scan_iter(match=f"*{queue}*"))
            if keys:
                redis.delete(*keys)
            redis.close()


@pytest.fixture
def service(tmp_path: Path, database_url: str) -> Iterator[Service]:
    with deployment(tmp_path, database_url) as running:
        yield running


@pytest.fixture(scope="session")
def light_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new venv with the bare package installed from a copy of the checkout (no .venv, no
    caches), as `pip install opd-service` would install it (test_light_install.py and
    test_newcomer.py share it)."""
    base = tmp_path_factory.mktemp("light")
    source = base / "src"
    shutil.copytree(
        ROOT,
        source,
        ignore=shutil.ignore_patterns(".venv", ".git", "__pycache__", "*.egg-info", "runs"),
    )
    env = base / "venv"
    venv.create(env, with_pip=True)
    python = env / "bin" / "python"
    subprocess.run(
        [python, "-m", "pip", "install", "-q", "--progress-bar", "off", str(source)],
        check=True,
        capture_output=True,
        timeout=600,
    )
    return env


def run_light(
    env: Path, *args: str | Path, cwd: Path, **variables: str
) -> subprocess.CompletedProcess[str]:
    """A command in the bare install's environment (PATH, HOME and `variables` alone)."""
    return subprocess.run(
        [str(a) for a in args],
        cwd=cwd,  # not the checkout: the installed package, not the source tree, is imported
        env={"PATH": f"{env / 'bin'}:/usr/bin:/bin", "HOME": str(cwd), **variables},
        capture_output=True,
        text=True,
        timeout=300,
    )
