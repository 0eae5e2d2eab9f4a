"""Chaos soak: the whole service under random faults, then every promise checked.

Starts a deployment of its own: a private Postgres cluster and Redis server
(tests/e2e/servers.py), 2 `opd api` and 3 `opd worker` processes (2 slots each) and one
webhook receiver per team (tests/e2e/receiver.py). Clients of three teams (two with
limits) submit --jobs tiny local-backend jobs of mixed kinds (on policy, one step off
policy, with evals, with frequent saves) spread over the first 80% of the window, and
pause-then-resume or cancel some of them. For --minutes, at seeded random moments, one
fault at a time: kill -9 a worker (restarted 0-10 s later), SIGTERM a worker, kill -9 an
API, restart Redis empty, restart Postgres, SIGSTOP a Postgres backend for 2-6 s. Then
the faults stop, the jobs finish, and it checks, reading the database:

- every job reached the end its client asked for; none lost, none duplicated (one job
  per Idempotency-Key), none started twice at once (attempt events: numbered 1..n, and a
  takeover only from a worker that was dead by then);
- each job's step rows are exactly its steps, and equal, bit for bit, those of a clean
  run of the same spec (the engine alone, in this process, before the deployment
  starts; a cancelled job's rows are a prefix of them); a succeeded job's usage totals
  equal the clean run's;
- each job's terminal webhook event reached its team's receiver, once after
  deduplication by `webhook-id`; every submit, pause, resume and cancel has its audit
  row; no team ran more jobs at once than its limit.

Prints the faults injected and the checks as a table; exits 1 when a check fails (the
deployment's logs are kept and their folder printed), 130 on Ctrl-C.

    python benchmarks/chaos_soak.py                           # 120 jobs, 15 minutes
    python benchmarks/chaos_soak.py --jobs 20 --minutes 1 --faults 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import psycopg
import yaml
from psycopg.rows import dict_row

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness import BenchmarkError, Command, Processes, interrupt, progress  # noqa: E402
from support import free_port  # noqa: E402

from tests.e2e.receiver import Receiver, Server  # noqa: E402
from tests.e2e.servers import PostgresServer, RedisServer  # noqa: E402

TINY = ROOT / "examples" / "tiny.yaml"
TERMINAL = ("succeeded", "failed", "cancelled")
WORKERS, APIS, SLOTS = 3, 2, 2
STOP_TIMEOUT = 120.0
HEARTBEAT_TIMEOUT = 15.0  # longer than a stopped backend or a Postgres restart
REQUEST_PATIENCE = 300.0  # how long a client retries one request before it gives up
DRAIN_TIMEOUT = 900.0  # how long the jobs may take to end once the faults stop
WEBHOOK_TIMEOUT = 120.0
POLL_SECONDS = 1.0
WATCH_SECONDS = 0.25  # polls of a client waiting for the step to act at
SUBMIT_SHARE = 0.8  # jobs arrive over this share of the window
SOAK = "chaos-soak"  # application_name of our own connections: never SIGSTOPped

TEAMS = {"red": {}, "green": {"max_running": 2}, "blue": {"max_running": 1, "max_queued": 4}}
TEAM_WEIGHTS = (0.5, 0.3, 0.2)
KINDS: dict[str, dict[str, Any]] = {  # loop settings; eval: a held-out eval every 10 steps
    "on-policy": {},
    "off-policy": {"max_steps_off_policy": 1, "save_every": 10},
    "eval": {"save_every": 10},
    "save-every": {"save_every": 5},
}
PLANS = {"run": 0.55, "pause": 0.2, "cancel": 0.15, "cancel-at-once": 0.1}
FAULTS = {
    "kill-worker": "kill -9 a worker (restarted after 0-10 s)",
    "term-worker": "SIGTERM a worker (restarted once drained)",
    "kill-api": "kill -9 an API (restarted after 0-5 s)",
    "restart-redis": "restart Redis empty",
    "restart-postgres": "restart Postgres (immediate stop)",
    "stop-backend": "SIGSTOP a Postgres backend for 2-6 s",
}
TAKEOVER = re.compile(r"Attempt (\d+) took over on \S+: worker \S+:(\d+) stopped sending")
ATTEMPT = re.compile(r"Attempt (\d+) (?:started|took over) on ")
ACTION_EVENTS = {  # the timeline entries an API action writes with its change
    "cancel": ("Cancelled while ", "Cancel requested"),
    "pause": ("Paused while queued", "Pause requested"),
    "resume": ("Resumed; waiting", "Resumed before the pause"),
}
USAGE = ("sampled_tokens", "teacher_tokens", "trained_tokens", "eval_tokens")


def compared(key: str) -> bool:
    """Metrics a replay must repeat exactly: all but the clocks."""
    return not (key.startswith("time/") or key.endswith("_per_second"))


# --- the plan ---------------------------------------------------------------------------------


def job_spec(kind: str, seed: int, steps: int) -> dict[str, Any]:
    """examples/tiny.yaml made small: 2 x 2 rollouts of 8 tokens a step, on the CPU."""
    spec = yaml.safe_load(TINY.read_text())
    held_out = spec.pop("eval")
    spec["name"] = f"soak-{kind}-{seed}"
    spec["student"]["seed"] = seed
    spec["sampling"]["max_tokens"] = 8
    spec["loop"] |= {"steps": steps, "batch_size": 2, "group_size": 2, **KINDS[kind]}
    spec["local"] = {"device": "cpu", "cpu_threads": 1}
    if kind == "eval":
        spec["eval"] = held_out | {"every": 10, "samples_per_prompt": 1, "max_tokens": 8}
    return spec


@dataclass
class Order:
    """One job a client submits, what it does to it, and what it saw."""

    team: str
    spec: dict[str, Any]
    plan: str
    submit_at: float
    act_at_step: int
    hold_seconds: float
    key: str = ""
    job_ids: set[int] = field(default_factory=set)
    answers: list[tuple[str, int]] = field(default_factory=list)
    """(action, HTTP status) of every answered request that changed or asked to change it."""
    expected: str = "succeeded"
    final: str | None = None
    error: str | None = None

    @property
    def spec_key(self) -> str:
        return self.spec["name"]


def plan_orders(options: argparse.Namespace, run_id: str) -> list[Order]:
    """The jobs, their teams, plans and arrival times: a function of --seed."""
    jobs, window, steps = options.jobs, options.minutes * 60, options.steps
    chance = random.Random(options.seed)
    seeds = range(1, 1 + max(1, jobs // 40))  # 120 jobs: 12 distinct specs to run clean
    orders = []
    for index in range(jobs):
        kind = chance.choice(list(KINDS))
        spec = job_spec(kind, chance.choice(seeds), steps)
        orders.append(
            Order(
                team=chance.choices(list(TEAMS), TEAM_WEIGHTS)[0],
                spec=spec,
                plan=chance.choices(list(PLANS), list(PLANS.values()))[0],
                submit_at=chance.uniform(0, SUBMIT_SHARE * window),
                act_at_step=chance.randint(1, steps // 2),
                hold_seconds=chance.uniform(0.5, 5),
                key=f"soak-{run_id}-{index}",
            )
        )
    return orders


# --- the clean runs ---------------------------------------------------------------------------


def clean_runs(specs: dict[str, dict[str, Any]], folder: Path) -> dict[str, dict[int, dict]]:
    """Each distinct spec run once by the engine alone: the rows every job must equal."""
    from kernel.spec import JobSpec
    from worker.engine.loop import run_job
    from worker.engine.sinks import Sink

    class Rows(Sink):
        def __init__(self) -> None:
            self.rows: dict[int, dict[str, float]] = {}

        def step(self, step: int, metrics: dict[str, float]) -> None:
            self.rows[step] = dict(metrics)

        def eval(self, step: int, metrics: dict[str, float]) -> None:
            self.rows[step] = dict(metrics)

    curves = {}
    for name, spec in specs.items():
        rows = Rows()
        run = run_job(
            JobSpec.model_validate(spec), rows, artifact_dir=folder / name, data_root=folder
        )
        asyncio.run(run)
        curves[name] = rows.rows
    return curves


def usage_of(rows: dict[int, dict[str, Any]]) -> dict[str, int]:
    return {name: int(sum(r.get(f"usage/{name}", 0) for r in rows.values())) for name in USAGE}


# --- the deployment ---------------------------------------------------------------------------


@dataclass
class Role:
    """One process of the deployment (api-0, worker-2), restarted under the same name."""

    name: str
    args: list[str]
    url: str | None = None
    command: Command | None = None
    starts: int = 0
    down: bool = False  # stopped by a fault, restart pending

    @property
    def pid(self) -> int:
        assert self.command is not None
        return self.command.process.pid

    def alive(self) -> bool:
        return self.command is not None and self.command.process.poll() is None


@dataclass
class Deployment:
    home: Path
    env: dict[str, str]
    processes: Processes
    postgres: PostgresServer
    redis: RedisServer
    roles: list[Role] = field(default_factory=list)
    died_at: dict[int, float] = field(default_factory=dict)
    """Worker pid -> time.time() its process was gone (killed or drained)."""
    unplanned_exits: list[str] = field(default_factory=list)
    admin_key: str = ""

    def opd(self, *args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "opd.cli", *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if done.returncode != 0:
            raise BenchmarkError(f"opd {' '.join(args)} failed:\n{done.stderr}")
        return done.stdout.strip()

    def start(self, role: Role, wait: bool = True) -> None:
        """Start (or restart) the role's process; an API is waited for unless not `wait`."""
        role.starts += 1
        argv = [sys.executable, "-m", "opd.cli", *role.args]
        role.command = self.processes.command(f"{role.name}.{role.starts}", argv, self.env)
        role.down = False
        if wait and role.url is not None:
            role.command.wait_until_serving(f"{role.url}/healthz")

    def of(self, kind: str) -> list[Role]:
        return [role for role in self.roles if role.name.startswith(kind)]

    def ended(self, role: Role) -> None:
        """Wait for the role's process to be gone (a drain may take a while: then kill)."""
        assert role.command is not None
        process = role.command.process
        try:
            process.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            progress(f"{role.name} did not stop within {STOP_TIMEOUT:.0f} s; killing it")
            process.kill()
            process.wait()
        if role.name.startswith("worker"):
            self.died_at[process.pid] = time.time()

    def restart(self, role: Role) -> None:
        """Start the role again; one that fails to start is left to `supervise`."""
        try:
            self.start(role)
        except BenchmarkError as error:
            progress(str(error))
            role.down = False

    def supervise(self) -> None:
        """Restart a process that exited without a fault asking it to; note it."""
        for role in self.roles:
            if role.down or role.alive():
                continue
            if role.command is not None:
                self.ended(role)
                code = role.command.process.returncode
                self.unplanned_exits.append(f"{role.name}.{role.starts} (exit status {code})")
                progress(f"{role.name} exited by itself (status {code}); restarting it")
            self.restart(role)

    @property
    def api_urls(self) -> list[str]:
        return [role.url for role in self.of("api") if role.url]


@contextmanager
def scratch_home() -> Iterator[Path]:
    """The deployment's OPD_HOME and logs: removed after a passing run, kept otherwise."""
    home = Path(tempfile.mkdtemp(prefix="opd-soak-"))
    try:
        yield home
    except KeyboardInterrupt:
        shutil.rmtree(home, ignore_errors=True)
        raise
    except BaseException:
        print(f"Logs kept in {home}", file=sys.stderr)
        raise
    shutil.rmtree(home, ignore_errors=True)


@contextmanager
def deployment(home: Path) -> Iterator[Deployment]:
    with ExitStack() as stack:
        postgres = PostgresServer()
        stack.callback(postgres.remove)
        postgres.start()
        redis = RedisServer()
        stack.callback(redis.remove)
        redis.start()
        processes = Processes(home)
        stack.callback(processes.close)
        env = os.environ | {
            "PYTHONPATH": str(ROOT),
            "OPD_HOME": str(home / "opd"),
            "OPD_DATABASE_URL": postgres.url,
            "OPD_REDIS_URL": redis.url,
            "OPD_QUEUE_NAME": "opd-soak",
            "OPD_WORKER_CONCURRENCY": str(SLOTS),
            "OPD_HEARTBEAT_INTERVAL": "1",
            "OPD_HEARTBEAT_TIMEOUT": str(HEARTBEAT_TIMEOUT),
            "OPD_SWEEP_INTERVAL": "2",
            "OPD_WEBHOOK_ALLOW_PRIVATE": "true",
            "OPD_WEBHOOK_POLL_INTERVAL": "0.5",
            "OPD_WEBHOOK_BACKOFF_SECONDS": "0.5",
            "OPD_WEBHOOK_BACKOFF_MAX_SECONDS": "5",
            "OPD_WEBHOOK_TIMEOUT": "5",
        }
        service = Deployment(home, env, processes, postgres, redis)
        print(
            f"Deployment: OPD_HOME {home}, Postgres {postgres.folder}, Redis {redis.folder}",
            flush=True,
        )
        service.opd("migrate")
        service.admin_key = service.opd("keys", "create", "--team", "ops", "--scope", "admin")
        for index in range(APIS):
            port = str(free_port())
            args = ["api", "--port", port, "--quiet"]
            service.roles.append(Role(f"api-{index}", args, f"http://127.0.0.1:{port}"))
        service.roles += [Role(f"worker-{index}", ["worker"]) for index in range(WORKERS)]
        for role in service.roles:  # all at once: each spends seconds importing
            service.start(role, wait=False)
        for role in service.of("api"):
            assert role.command is not None
            role.command.wait_until_serving(f"{role.url}/healthz")
        yield service


def postgres_connection(service: Deployment) -> psycopg.Connection:
    return psycopg.connect(
        service.postgres.url,
        autocommit=True,
        connect_timeout=2,
        application_name=SOAK,
        row_factory=dict_row,
    )


# --- the faults -------------------------------------------------------------------------------


@dataclass
class Fault:
    at: float
    kind: str
    target: str


class Chaos:
    """Injects faults one at a time; restarts run in the background."""

    def __init__(self, service: Deployment, chance: random.Random) -> None:
        self.service = service
        self.chance = chance
        self.injected: list[Fault] = []
        self.restarts: list[asyncio.Task[None]] = []

    def note(self, kind: str, target: str) -> None:
        self.injected.append(Fault(time.time(), kind, target))
        progress(f"fault: {FAULTS[kind]}: {target}")

    async def restart_later(self, role: Role, delay: float) -> None:
        await asyncio.sleep(delay)
        await asyncio.to_thread(self.service.restart, role)

    def live(self, kind: str) -> list[Role]:
        return [role for role in self.service.of(kind) if role.alive() and not role.down]

    async def inject(self, kind: str) -> None:
        service, chance = self.service, self.chance
        if kind in ("kill-worker", "term-worker", "kill-api"):
            candidates = self.live("api" if kind == "kill-api" else "worker")
            if not candidates:
                return
            role = chance.choice(candidates)
            role.down = True
            self.note(kind, f"{role.name} (pid {role.pid})")
            process = role.command.process if role.command else None
            assert process is not None
            process.send_signal(signal.SIGTERM if kind == "term-worker" else signal.SIGKILL)
            await asyncio.to_thread(service.ended, role)
            delay = {"kill-worker": 10, "kill-api": 5}.get(kind, 0) * chance.random()
            self.restarts.append(asyncio.create_task(self.restart_later(role, delay)))
        elif kind == "restart-redis":
            self.note(kind, f"port {service.redis.port}")
            service.redis.stop()
            await asyncio.sleep(chance.uniform(0, 3))
            await asyncio.to_thread(service.redis.start)
        elif kind == "restart-postgres":
            self.note(kind, f"port {service.postgres.port}")
            await asyncio.to_thread(service.postgres.stop)
            await asyncio.sleep(chance.uniform(0, 3))
            await asyncio.to_thread(service.postgres.start)
        else:
            await self.stop_backend()

    async def stop_backend(self) -> None:
        def backends() -> list[int]:
            with postgres_connection(self.service) as conn:
                rows = conn.execute(
                    "SELECT pid FROM pg_stat_activity WHERE backend_type = 'client backend'"
                    " AND application_name <> %s ORDER BY pid",
                    (SOAK,),
                ).fetchall()
            return [row["pid"] for row in rows]

        pids = await asyncio.to_thread(backends)
        if not pids:
            return
        pid = self.chance.choice(pids)
        seconds = self.chance.uniform(2, 6)
        self.note("stop-backend", f"backend pid {pid} for {seconds:.1f} s")
        try:
            os.kill(pid, signal.SIGSTOP)
            await asyncio.sleep(seconds)
        except ProcessLookupError:
            return
        finally:
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    async def run(self, kinds: list[str], window: float, count: int) -> None:
        """`count` faults, each at a random moment of its own share of the window; every
        kind comes before any repeats."""
        sequence: list[str] = []
        while len(sequence) < count:
            sequence += self.chance.sample(kinds, len(kinds))
        started = time.monotonic()
        share = window / max(1, count)
        for index, kind in enumerate(sequence[:count]):
            moment = started + share * index + self.chance.uniform(0, share * 0.8)
            await asyncio.sleep(max(0.0, moment - time.monotonic()))
            await asyncio.gather(*self.restarts)  # one fault at a time, restarts included
            await self.inject(kind)
        await asyncio.sleep(max(0.0, started + window - time.monotonic()))
        await asyncio.gather(*self.restarts)


async def supervise(service: Deployment, done: asyncio.Event) -> None:
    while not done.is_set():
        await asyncio.to_thread(service.supervise)
        await asyncio.sleep(1.0)


# --- the clients ------------------------------------------------------------------------------


class ClientGaveUp(Exception):
    pass


@dataclass
class Traffic:
    transport_errors: int = 0
    server_errors: Counter[int] = field(default_factory=Counter)
    throttled: int = 0


class Clients:
    def __init__(self, service: Deployment, keys: dict[str, str], http: httpx.AsyncClient):
        self.service = service
        self.keys = keys
        self.http = http
        self.traffic = Traffic()
        self.turn = 0

    async def call(self, team: str, method: str, path: str, **options: Any) -> httpx.Response:
        """The first answer below 500 (429 is waited out), from whichever API answers;
        transport errors and 5xx are retried."""
        headers = {"Authorization": f"Bearer {self.keys[team]}", **options.pop("headers", {})}
        deadline = time.monotonic() + REQUEST_PATIENCE
        attempt = 0
        while True:
            urls = self.service.api_urls
            self.turn += 1
            url = urls[self.turn % len(urls)]
            try:
                response = await self.http.request(
                    method, f"{url}{path}", headers=headers, timeout=30, **options
                )
                if response.status_code == 429:  # the team's queue is full: not a fault
                    self.traffic.throttled += 1
                    deadline = time.monotonic() + REQUEST_PATIENCE
                elif response.status_code < 500:
                    return response
                else:
                    self.traffic.server_errors[response.status_code] += 1
            except httpx.TransportError:
                self.traffic.transport_errors += 1
            if time.monotonic() > deadline:
                raise ClientGaveUp(f"{method} {path} found no answer in {REQUEST_PATIENCE:.0f} s")
            attempt += 1
            await asyncio.sleep(min(3.0, 0.1 * 2**attempt))

    async def job(self, order: Order, job_id: int) -> dict[str, Any]:
        response = await self.call(order.team, "GET", f"/v1/jobs/{job_id}")
        response.raise_for_status()
        return response.json()

    async def wait(
        self,
        order: Order,
        job_id: int,
        until: Callable[[dict], bool],
        every: float = POLL_SECONDS,
    ) -> dict:
        while not until(job := await self.job(order, job_id)):
            await asyncio.sleep(every)
        return job

    async def act(self, order: Order, job_id: int, action: str) -> dict[str, Any] | None:
        response = await self.call(order.team, "POST", f"/v1/jobs/{job_id}/{action}")
        order.answers.append((action, response.status_code))
        if response.status_code == 409:
            return None  # too late: the job already ended
        response.raise_for_status()
        return response.json()

    async def drive(self, order: Order, started: float) -> None:
        await asyncio.sleep(max(0.0, started + order.submit_at - time.monotonic()))
        response = await self.call(
            order.team,
            "POST",
            "/v1/jobs",
            json=order.spec,
            headers={"Idempotency-Key": order.key},
        )
        if response.status_code not in (200, 201):
            raise ClientGaveUp(f"submit answered {response.status_code}: {response.text[:200]}")
        order.answers.append(("submit", response.status_code))
        job_id = response.json()["id"]
        order.job_ids.add(job_id)
        ended = lambda job: job["status"] in TERMINAL  # noqa: E731
        if order.plan == "cancel-at-once":
            if await self.act(order, job_id, "cancel") is not None:
                order.expected = "cancelled"
        elif order.plan in ("pause", "cancel"):
            await self.wait(
                order,
                job_id,
                lambda job: (
                    ended(job)
                    or (job["status"] == "running" and job["steps_done"] >= order.act_at_step)
                ),
                WATCH_SECONDS,
            )
            if order.plan == "cancel":
                if await self.act(order, job_id, "cancel") is not None:
                    order.expected = "cancelled"
            elif await self.act(order, job_id, "pause") is not None:
                job = await self.wait(
                    order, job_id, lambda job: ended(job) or job["status"] == "paused"
                )
                if job["status"] == "paused":
                    await asyncio.sleep(order.hold_seconds)
                    await self.act(order, job_id, "resume")
        order.final = (await self.wait(order, job_id, ended))["status"]

    async def run(self, order: Order, started: float) -> None:
        try:
            await self.drive(order, started)
        except (ClientGaveUp, httpx.HTTPStatusError) as error:
            order.error = str(error)
            progress(f"job {order.key}: {error}")


# --- the watchers -----------------------------------------------------------------------------


@contextmanager
def running_peaks(service: Deployment) -> Iterator[dict[str, int]]:
    """The most jobs each team had running at once, sampled from the database meanwhile."""
    peaks: dict[str, int] = defaultdict(int)
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            try:
                with postgres_connection(service) as conn:
                    while not done.is_set():
                        rows = conn.execute(
                            "SELECT teams.name, count(*) AS n FROM jobs JOIN teams"
                            " ON teams.id = jobs.team_id WHERE status IN"
                            " ('running', 'cancelling', 'pausing') GROUP BY teams.name"
                        ).fetchall()
                        for row in rows:
                            peaks[row["name"]] = max(peaks[row["name"]], row["n"])
                        time.sleep(0.2)
            except psycopg.Error:
                time.sleep(0.5)  # Postgres is restarting

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield peaks
    finally:
        done.set()
        thread.join()


# --- the checks -------------------------------------------------------------------------------


@dataclass
class Check:
    """One promise: how many times it was broken, out of how many chances, with examples."""

    name: str
    found: int = 0
    out_of: int | None = None
    examples: list[str] = field(default_factory=list)

    def broken(self, example: str, times: int = 1) -> None:
        self.found += times
        self.examples.append(example)

    def chance(self, times: int = 1) -> None:
        self.out_of = (self.out_of or 0) + times

    @property
    def passed(self) -> bool:
        return self.found == 0


def seconds(moment: datetime) -> float:
    """time.time() of a database timestamp (stored in UTC, with or without its zone)."""
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


def as_dict(value: Any) -> dict[str, Any]:
    """A JSON column's value (psycopg decodes json and jsonb, not json stored as text)."""
    return value if isinstance(value, dict) else json.loads(value)


@dataclass
class Snapshot:
    """What the database holds once the soak is over, read once."""

    jobs: dict[int, dict[str, Any]]
    events: dict[int, list[dict[str, Any]]]
    steps: dict[int, dict[int, dict[str, Any]]]
    audit: list[dict[str, Any]]

    @classmethod
    def read(cls, service: Deployment) -> Snapshot:
        events: dict[int, list[dict[str, Any]]] = defaultdict(list)
        steps: dict[int, dict[int, dict[str, Any]]] = defaultdict(dict)
        with postgres_connection(service) as conn:
            jobs = {row["id"]: row for row in conn.execute("SELECT * FROM jobs")}
            for row in conn.execute("SELECT job_id, message, created_at FROM events ORDER BY id"):
                events[row["job_id"]].append(row)
            for row in conn.execute("SELECT job_id, step, metrics FROM step_metrics"):
                steps[row["job_id"]][row["step"]] = as_dict(row["metrics"])
            audit = conn.execute("SELECT action, target, status_code, detail FROM audit_log")
            return cls(jobs, events, steps, audit.fetchall())

    def job(self, order: Order) -> dict[str, Any] | None:
        return self.jobs.get(next(iter(order.job_ids))) if order.job_ids else None

    def timeline(self, job_id: int) -> str:
        return " | ".join(event["message"][:70] for event in self.events[job_id])

    def count(self, matches: Callable[[str], Any]) -> int:
        return sum(1 for job in self.events.values() for e in job if matches(e["message"]))


def check_ends(orders: list[Order], db: Snapshot) -> list[Check]:
    wrong = Check("every job reached the end its client asked for", out_of=len(orders))
    lost = Check("lost: not accepted, not in the database, or never ended", out_of=len(orders))
    doubled = Check("duplicated: more than one job for one submission", out_of=len(orders))
    per_key = Counter(job["idempotency_key"] for job in db.jobs.values())
    for order in orders:
        job = db.job(order)
        if order.error or job is None or job["status"] not in TERMINAL:
            lost.broken(f"{order.key}: {order.error or (job['status'] if job else 'missing')}")
        elif job["status"] != order.expected or order.final != job["status"]:
            error = f" ({job['error_code']}: {job['error_message']})" if job["error_code"] else ""
            wrong.broken(
                f"job {job['id']} ({order.spec_key}, {order.plan}, answers {order.answers}): "
                f"{job['status']}{error}, expected {order.expected}; {db.timeline(job['id'])}"
            )
        if len(order.job_ids) > 1 or per_key[order.key] > 1:
            doubled.broken(f"{order.key}: jobs {sorted(order.job_ids)}")
    keys = {order.key for order in orders}
    for job_id, job in db.jobs.items():
        if job["idempotency_key"] not in keys:
            doubled.broken(f"job {job_id} was submitted by no client")
    return [wrong, lost, doubled]


def check_attempts(service: Deployment, db: Snapshot) -> Check:
    """Attempts are numbered 1..n, once each, and a takeover comes only after the worker
    that held the job was gone: no job ran on two workers at once."""
    twice = Check("started twice at once (attempt events)", out_of=len(db.jobs))
    for job_id, job in db.jobs.items():
        timeline = db.events[job_id]
        numbers = [int(m[1]) for e in timeline if (m := ATTEMPT.match(e["message"]))]
        live = [
            int(m[1])
            for e in timeline
            if (m := TAKEOVER.match(e["message"]))
            and service.died_at.get(int(m[2]), float("inf")) > seconds(e["created_at"])
        ]
        if numbers != list(range(1, job["attempts"] + 1)) or live:
            twice.broken(f"job {job_id}: attempts {numbers}, taken from a live worker {live}")
    return twice


def check_steps(orders: list[Order], db: Snapshot, curves: dict[str, dict]) -> list[Check]:
    """A succeeded job's rows are the clean run's steps, a cancelled job's the first ones;
    every value equals the clean run's; a succeeded job's usage is the clean run's."""
    rows_wrong = Check("step rows not exactly the job's steps", out_of=len(orders))
    differing = Check("step values differing from the clean run, bit for bit", out_of=0)
    usage_wrong = Check("usage totals differing from the clean run", out_of=0)
    for order in orders:
        job = db.job(order)
        if job is None:
            continue
        clean, rows = curves[order.spec_key], db.steps[job["id"]]
        succeeded = job["status"] == "succeeded"
        expected = sorted(clean) if succeeded else list(range(len(rows)))
        if sorted(rows) != expected or not rows.keys() <= clean.keys():
            rows_wrong.broken(f"job {job['id']} ({job['status']}): steps {sorted(rows)}")
        for step in rows.keys() & clean.keys():
            want = {k: v for k, v in clean[step].items() if compared(k)}
            have = {k: v for k, v in rows[step].items() if compared(k)}
            differing.chance(len(want))
            for key in sorted(want.keys() | have.keys()):
                if want.get(key) != have.get(key):
                    differing.broken(
                        f"job {job['id']} step {step} {key}: {have.get(key)!r} != {want.get(key)!r}"
                    )
        if succeeded:
            usage_wrong.chance()
            have_usage = {name: job[name] for name in USAGE}
            if have_usage != usage_of(clean):
                usage_wrong.broken(f"job {job['id']}: {have_usage} != {usage_of(clean)}")
    return [rows_wrong, differing, usage_wrong]


def check_webhooks(
    orders: list[Order], db: Snapshot, receivers: dict[str, Receiver]
) -> tuple[list[Check], int]:
    """Each ended job's terminal event reached its team's receiver, under one webhook-id.
    Returns the checks and how many deliveries were repeats (at least once, as designed)."""
    missing = Check("terminal webhook events not received", out_of=0)
    doubled = Check("terminal webhook events received under two webhook-ids", out_of=0)
    repeats = 0
    for order in orders:
        job = db.job(order)
        if job is None or job["status"] not in TERMINAL:
            continue
        event = f"job.{job['status']}"
        receiver = receivers[order.team]
        with receiver.lock:
            seen = [
                arrival.message_id
                for arrival in receiver.arrivals
                if arrival.payload["type"] == event
                and arrival.payload["data"].get("job_id") == job["id"]
            ]
        repeats += len(seen) - len(set(seen))
        missing.chance()
        doubled.chance()
        if not seen:
            missing.broken(f"job {job['id']} {event}")
        elif len(set(seen)) > 1:
            doubled.broken(f"job {job['id']} {event}: {sorted(set(seen))}")
    refused = Check("webhook deliveries whose signature the receiver refused")
    refused.found = sum(receiver.rejected for receiver in receivers.values())
    return [missing, doubled, refused], repeats


def check_audit(orders: list[Order], db: Snapshot) -> Check:
    """Every job has its `job.submit` row, every change an API action made (its timeline
    entry) has its row, and every request the clients saw answered 200 has its row."""
    unaudited = Check("actions without their audit row", out_of=0)
    changes: Counter[tuple[str, str]] = Counter()
    requests: Counter[tuple[str, str]] = Counter()
    for entry in db.audit:
        action, target = entry["action"].removeprefix("job."), entry["target"]
        requests[(action, target)] += 1
        detail = as_dict(entry["detail"]) if entry["detail"] is not None else {}
        if (action == "submit" and entry["status_code"] == 201) or detail.get("changed"):
            changes[(action, target)] += 1
    made: Counter[tuple[str, str]] = Counter()
    for job_id in db.jobs:
        made[("submit", f"job {job_id}")] += 1
        for event in db.events[job_id]:
            for action, entries in ACTION_EVENTS.items():
                made[(action, f"job {job_id}")] += event["message"].startswith(entries)
    answered = Counter(
        (action, f"job {job['id']}")
        for order in orders
        if (job := db.job(order)) is not None
        for action, status in order.answers
        if status == 200 and action != "submit"  # a repeated submit (200) changes nothing
    )
    for wanted, rows, what in ((made, changes, "changes"), (answered, requests, "answers")):
        for (action, target), count in wanted.items():
            unaudited.chance(count)
            if rows[(action, target)] < count:
                missing = count - rows[(action, target)]
                unaudited.broken(
                    f"{target}: {action} {what} x{count}, rows {missing} short", missing
                )
    return unaudited


def check_limits(peaks: dict[str, int]) -> Check:
    over = Check("team limits exceeded (most jobs running at once)", out_of=len(TEAMS))
    for team, limits in TEAMS.items():
        if peaks.get(team, 0) > limits.get("max_running", float("inf")):
            over.broken(f"{team}: {peaks[team]} running at once, limit {limits['max_running']}")
    return over


@dataclass
class Findings:
    checks: list[Check]
    end_states: Counter[str]
    figures: dict[str, Any]

    @property
    def passed(self) -> bool:
        return all(check.passed for check in self.checks)


def check_all(
    service: Deployment,
    orders: list[Order],
    curves: dict[str, dict[int, dict]],
    receivers: dict[str, Receiver],
    peaks: dict[str, int],
) -> Findings:
    db = Snapshot.read(service)
    webhooks, repeats = check_webhooks(orders, db, receivers)
    crashed = Check("processes that exited without a fault")
    for exit in service.unplanned_exits:
        crashed.broken(exit)
    checks = [
        *check_ends(orders, db),
        check_attempts(service, db),
        *check_steps(orders, db, curves),
        *webhooks,
        check_audit(orders, db),
        check_limits(peaks),
        crashed,
    ]
    figures = {
        "attempts": sum(job["attempts"] for job in db.jobs.values()),
        "resumed": db.count(lambda message: message.startswith("Resumed from")),
        "takeovers": db.count(TAKEOVER.match),
        "requeued": db.count(lambda message: message.startswith("Requeued")),
        "webhook repeats": repeats,
        "peaks": dict(peaks),
    }
    return Findings(checks, Counter(job["status"] for job in db.jobs.values()), figures)


# --- the run ----------------------------------------------------------------------------------


def setup_call(service: Deployment, key: str, method: str, path: str, body: dict) -> dict:
    url = service.api_urls[0]
    headers = {"Authorization": f"Bearer {key}"}
    response = httpx.request(method, f"{url}{path}", json=body, headers=headers, timeout=30)
    if not response.is_success:
        raise BenchmarkError(f"{method} {path}: {response.status_code} {response.text}")
    return response.json()


def create_team(
    service: Deployment, name: str, limits: dict[str, int], hook_url: str
) -> tuple[str, str]:
    """The team's key (limits set), and the secret of its webhook to `hook_url`."""
    admin = service.admin_key
    key = setup_call(service, admin, "POST", "/v1/keys", {"team": name})["key"]
    if limits:
        setup_call(service, admin, "PATCH", f"/v1/teams/{name}", limits)
    events = ["job.succeeded", "job.failed", "job.cancelled", "job.paused"]
    hook = setup_call(service, key, "POST", "/v1/webhooks", {"url": hook_url, "events": events})
    return key, hook["secret"]


async def soak(
    service: Deployment,
    orders: list[Order],
    keys: dict[str, str],
    options: argparse.Namespace,
) -> tuple[list[Fault], Traffic]:
    chance = random.Random(options.seed + 1)
    chaos = Chaos(service, chance)
    window = options.minutes * 60
    done = asyncio.Event()
    watcher = asyncio.create_task(supervise(service, done))
    async with httpx.AsyncClient() as http:
        clients = Clients(service, keys, http)
        started = time.monotonic()
        driving = asyncio.gather(*(clients.run(order, started) for order in orders))
        await chaos.run(options.kinds, window, options.faults)
        progress(f"{len(chaos.injected)} faults injected; waiting for the jobs to end")
        try:
            await asyncio.wait_for(driving, DRAIN_TIMEOUT)
        except TimeoutError:
            progress(f"jobs still running {DRAIN_TIMEOUT:.0f} s after the faults stopped")
    done.set()
    await watcher
    return chaos.injected, clients.traffic


def wait_for_webhooks(orders: list[Order], receivers: dict[str, Receiver]) -> None:
    """Until each ended job's terminal event arrived, or WEBHOOK_TIMEOUT passes."""
    deadline = time.monotonic() + WEBHOOK_TIMEOUT
    while time.monotonic() < deadline:
        arrived = {
            (team, a.payload["data"].get("job_id"), a.payload["type"])
            for team, receiver in receivers.items()
            for a in receiver.delivered.copy().values()
        }
        due = {
            (order.team, job_id, f"job.{order.final}")
            for order in orders
            if order.final
            for job_id in order.job_ids
        }
        if due <= arrived:
            return
        time.sleep(0.5)


def run(options: argparse.Namespace) -> tuple[list[Fault], Findings, Traffic]:
    window = options.minutes * 60
    orders = plan_orders(options, f"{os.getpid()}")
    specs = {order.spec_key: order.spec for order in orders}
    with ExitStack() as stack:
        home = stack.enter_context(scratch_home())
        progress(f"clean runs of the {len(specs)} distinct specs (the engine alone)")
        began = time.monotonic()
        curves = clean_runs(specs, home / "clean")
        clean_seconds = time.monotonic() - began
        progress("starting the deployment: Postgres, Redis, 2 APIs, 3 workers")
        service = stack.enter_context(deployment(home))
        receivers = {team: Receiver() for team in TEAMS}
        keys = {}
        for team, limits in TEAMS.items():
            server = stack.enter_context(Server(receivers[team]))
            keys[team], receivers[team].secret = create_team(service, team, limits, server.url)
        progress(
            f"{len(orders)} jobs over {window * SUBMIT_SHARE:.0f} s, {options.faults} faults "
            f"over {window:.0f} s"
        )
        began = time.monotonic()
        with running_peaks(service) as peaks:
            faults, traffic = asyncio.run(soak(service, orders, keys, options))
        soak_seconds = time.monotonic() - began
        wait_for_webhooks(orders, receivers)
        findings = check_all(service, orders, curves, receivers, dict(peaks))
        findings.figures |= {"clean seconds": clean_seconds, "soak seconds": soak_seconds}
        if not findings.passed:
            print(report(options, faults, findings, traffic))
            raise ChecksFailed
    return faults, findings, traffic


class ChecksFailed(Exception):
    """A check failed: the table above says which."""


def report(
    options: argparse.Namespace, faults: list[Fault], findings: Findings, traffic: Traffic
) -> str:
    lines = [
        f"Chaos soak: {options.jobs} jobs, {options.minutes:g} min of faults, seed {options.seed}",
        "",
        f"{'Faults injected':<58} {'count':>7}",
    ]
    counts = Counter(fault.kind for fault in faults)
    for kind, text in FAULTS.items():
        if kind in options.kinds:
            lines.append(f"  {text:<56} {counts[kind]:>7}")
    lines.append(f"  {'total':<56} {len(faults):>7}")
    lines += ["", f"{'Jobs by end state':<58} {'count':>7}"]
    for status, count in sorted(findings.end_states.items()):
        lines.append(f"  {status:<56} {count:>7}")
    lines += ["", f"{'Checks':<58} {'found':>7} {'of':>7}  result"]
    for check in findings.checks:
        out_of = "-" if check.out_of is None else str(check.out_of)
        verdict = "PASS" if check.passed else "FAIL"
        lines.append(f"  {check.name:<56} {check.found:>7} {out_of:>7}  {verdict}")
        lines += [f"      {example}" for example in check.examples[:5]]
    figures = findings.figures
    lines += [
        "",
        f"Attempts {figures['attempts']}, resumed from a saved state {figures['resumed']}, "
        f"takeovers of dead workers' jobs {figures['takeovers']}, requeued by a drain "
        f"{figures['requeued']}; webhook deliveries repeated {figures['webhook repeats']}",
        f"Clients retried {traffic.transport_errors} transport errors and "
        f"{sum(traffic.server_errors.values())} 5xx answers "
        f"({dict(sorted(traffic.server_errors.items()))}), waited out {traffic.throttled} 429s",
        f"Most jobs running at once per team: {figures['peaks']} (limits: "
        + ", ".join(f"{t} {lim['max_running']}" for t, lim in TEAMS.items() if lim)
        + ")",
        f"Clean runs {figures['clean seconds']:.0f} s; the soak, from the first submit to "
        f"the last job's end, {figures['soak seconds']:.0f} s",
    ]
    lines += ["", "PASS: every check held" if findings.passed else "FAIL: see the checks above"]
    return "\n".join(lines)


def parse_options(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=120, help="jobs to submit (120)")
    parser.add_argument("--minutes", type=float, default=15.0, help="minutes of faults (15)")
    parser.add_argument(
        "--faults", type=int, help="faults to inject (default: one per 20 s of the window)"
    )
    parser.add_argument(
        "--kinds",
        default=",".join(FAULTS),
        help=f"comma-separated fault kinds (default all: {', '.join(FAULTS)})",
    )
    parser.add_argument("--steps", type=int, default=30, help="steps of every job (30)")
    parser.add_argument("--seed", type=int, default=0, help="the jobs, their plans and faults")
    options = parser.parse_args(argv)
    options.kinds = options.kinds.split(",")
    if unknown := set(options.kinds) - FAULTS.keys():
        parser.error(f"--kinds: unknown {', '.join(sorted(unknown))}")
    if options.jobs < 1 or options.minutes <= 0 or options.steps < 10:
        parser.error("--jobs and --minutes must be positive, --steps at least 10")
    if options.faults is None:
        options.faults = max(1, round(options.minutes * 3))
    return options


def main(argv: list[str] | None = None) -> int:
    options = parse_options(argv)
    signal.signal(signal.SIGTERM, interrupt)
    try:
        faults, findings, traffic = run(options)
    except ChecksFailed:
        return 1
    except BenchmarkError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted; everything it started was stopped and removed", file=sys.stderr)
        return 130
    print(report(options, faults, findings, traffic))
    return 0


if __name__ == "__main__":
    sys.exit(main())
