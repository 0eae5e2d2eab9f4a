"""Chaos soak: the whole service under random faults, then every promise checked.

Starts a deployment of its own: a private Postgres cluster, Redis server and S3 server
(moto, which everything reaches through a relay a fault can cut; tests/e2e/servers.py),
2 `opd api` and 3 `opd worker` processes (2 slots each) and one webhook receiver per team
(tests/e2e/receiver.py). Clients of three teams (two with limits) submit --jobs tiny
local-backend jobs of mixed kinds (on policy, one step off policy, with evals, with
frequent saves) spread over the first 80% of the window, and pause-then-resume or cancel
some of them; two of the teams create --sweeps sweeps (4 trials of learning rate x loss,
2 at a time, ASHA early stopping; a grid or random) over the first 60%, and cancel every
other one once a trial is halfway; --served jobs learn from a teacher on a server: the
service's own `/v1`, serving a job of their team that finished first. A team of its own
uploads files over the window, well-formed ones and malicious ones (JSON nested 100,000
deep, a Parquet bomb, a truncated Parquet file, odd encodings, a huge field), and another
sends a burst of 5 at once that together pass its quota. For --minutes, at seeded random
moments, one fault at a time: kill -9 a worker (restarted 0-10 s later), kill -9 the
worker whose controller holds a running sweep's lease, SIGTERM a worker, kill -9 an API,
restart Redis empty, restart Postgres, keep Postgres away longer than the heartbeat
timeout, SIGSTOP a Postgres backend for 2-6 s, cut the object store off for 5-15 s. Then
the faults stop, the jobs and sweeps finish, and it checks, reading the database:

- every job reached the end its client asked for; none lost, none duplicated (one job
  per Idempotency-Key), none started twice at once (attempt events: numbered 1..n, and a
  takeover only from a worker that was dead by then: a live worker's job is not taken
  over, even after Postgres was away longer than the heartbeat timeout);
- each job's step rows are exactly its steps, and equal, bit for bit, those of a clean
  run of the same spec (the engine alone, in this process, before the deployment
  starts; a cancelled job's rows are a prefix of them); a succeeded job's usage totals
  equal the clean run's. A job taught by a server has its steps once each (it is not
  compared with a clean run: the server batches its scoring with other requests, so the
  last bits of its answers may differ);
- every sweep reached the end its client asked for (once: its client resends its
  creation with one Idempotency-Key), a completed one with all its trials, each trial
  succeeded, stopped early or cancelled with its sweep; no trial number repeats within a
  sweep; no trial was created after its sweep ended; each trial's rows equal, bit for
  bit, a clean run of the spec the controller stored for it (run once the soak is over;
  an early-stopped trial's rows a prefix), its usage too;
- each job's and trial's terminal webhook event reached its team's receiver, once after
  deduplication by `webhook-id`; every submit, pause, resume and cancel, every sweep's
  creation and cancel has its audit row; no team ran more jobs at once than its limit;
- every upload was answered 201 (or 200, bytes the team already stored) or a 4xx, no
  process died without a fault (an upload that crashes an API shows there), and no team
  holds more file bytes than its quota.

Prints the faults injected and the checks as a table; exits 1 when a check fails (the
deployment's logs are kept and their folder printed), 130 on Ctrl-C.

    python benchmarks/chaos_soak.py                           # 120 jobs, 6 sweeps, 15 minutes
    python benchmarks/chaos_soak.py --jobs 20 --sweeps 2 --served 1 --minutes 1 --faults 3
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import math
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
from collections.abc import Awaitable, Callable, Iterator
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
from tests.e2e.servers import PostgresServer, RedisServer, Relay, S3Server  # noqa: E402

TINY = ROOT / "examples" / "tiny.yaml"
TERMINAL = ("succeeded", "failed", "cancelled")
WORKERS, APIS, SLOTS = 3, 2, 2
STOP_TIMEOUT = 120.0
HEARTBEAT_TIMEOUT = 15.0  # longer than a stopped backend or a Postgres restart
POSTGRES_OUTAGE = HEARTBEAT_TIMEOUT + 5  # the outage fault: longer than the timeout
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
SWEEP_TEAMS = ("red", "green")  # a blue sweep would wait on blue's one running job
SWEEP_PLANS = ("run", "cancel")  # in turn: a cancel after its first trials exist
SWEEP_SHARE = 0.6  # sweeps arrive over this share of the window, so faults find them running
SWEEP_METRIC = "opd/reverse_kl_mean"
SWEEP_VALUES = {
    "optim.learning_rate": [1.0e-3, 3.0e-3],
    "loop.loss_fn": ["importance_sampling", "ppo"],
}
CONTROLLER_WAIT = 20.0  # how long a kill-controller fault waits for a sweep to have one
FAULTS = {
    "kill-worker": "kill -9 a worker (restarted after 0-10 s)",
    "kill-controller": "kill -9 a sweep controller's worker (restarted 0-10 s)",
    "term-worker": "SIGTERM a worker (restarted once drained)",
    "kill-api": "kill -9 an API (restarted after 0-5 s)",
    "restart-redis": "restart Redis empty",
    "restart-postgres": "restart Postgres (immediate stop)",
    "outage-postgres": f"Postgres away {POSTGRES_OUTAGE:.0f} s (past the heartbeat timeout)",
    "stop-backend": "SIGSTOP a Postgres backend for 2-6 s",
    "outage-store": "cut the object store off for 5-15 s",
}
TAKEOVER = re.compile(r"Attempt (\d+) took over on \S+: worker \S+:(\d+) stopped sending")
ATTEMPT = re.compile(r"Attempt (\d+) (?:started|took over) on ")
ACTION_EVENTS = {  # the timeline entries an API action writes with its change
    "cancel": ("Cancelled while ", "Cancel requested"),
    "pause": ("Paused while queued", "Pause requested"),
    "resume": ("Resumed; waiting", "Resumed before the pause"),
}
USAGE = ("sampled_tokens", "teacher_tokens", "trained_tokens", "eval_tokens")
EARLY_STOPPED = "early_stopped"  # a trial's stop_reason when its sweep stopped it


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


@dataclass(kw_only=True)
class ClientOrder:
    """What a client does (its team, its plan, when it starts) and what it saw."""

    team: str
    plan: str
    submit_at: float
    answers: list[tuple[str, int]] = field(default_factory=list)
    """(action, HTTP status) of every answered request that changed or asked to change it."""
    expected: str
    final: str | None = None
    error: str | None = None


@dataclass(kw_only=True)
class Order(ClientOrder):
    """One job a client submits and what it does to it."""

    spec: dict[str, Any]
    act_at_step: int
    hold_seconds: float
    key: str = ""
    job_ids: set[int] = field(default_factory=set)
    expected: str = "succeeded"
    taught_by: Order | None = None
    """The job whose weights the service serves as this one's teacher (its spec's teacher
    is set once that job succeeded); None: a teacher of its own, compared with a clean run."""

    @property
    def spec_name(self) -> str:
        return self.spec["name"]

    @property
    def label(self) -> str:
        return f"job {self.key}"


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


def sweep_definition(index: int, seed: int, steps: int) -> dict[str, Any]:
    """Learning rate x loss around the on-policy job (4 specs in all, so 4 clean runs),
    2 trials at a time, ASHA from a fifth of the steps; a grid or 4 random trials."""
    return {
        "name": f"soak-sweep-{index}",
        "base": job_spec("on-policy", seed, steps),
        "parameters": {path: {"values": values} for path, values in SWEEP_VALUES.items()},
        "method": "grid" if index % 2 == 0 else "random",
        "metric": {"name": SWEEP_METRIC, "goal": "minimize"},
        "max_trials": 4,
        "parallel": 2,
        "seed": index,
        "early_stop": {"type": "asha", "min_steps": max(1, steps // 5), "eta": 2},
    }


@dataclass(kw_only=True)
class SweepOrder(ClientOrder):
    """One sweep a client creates (and perhaps cancels)."""

    definition: dict[str, Any]
    sweep_id: int | None = None
    expected: str = "completed"
    trials: dict[int, str] = field(default_factory=dict)
    """Its trials' job ids and end states, as the client last read them."""

    @property
    def name(self) -> str:
        return self.definition["name"]

    @property
    def label(self) -> str:
        return f"sweep {self.name}"


def plan_sweeps(options: argparse.Namespace) -> list[SweepOrder]:
    """The sweeps, their teams, plans and arrival times: a function of --seed."""
    chance = random.Random(options.seed + 2)
    seeds = range(1, 1 + max(1, options.jobs // 40))  # the jobs' seeds: shared clean runs
    window = options.minutes * 60
    return [
        SweepOrder(
            team=SWEEP_TEAMS[index % len(SWEEP_TEAMS)],
            definition=sweep_definition(index, chance.choice(seeds), options.steps),
            plan=SWEEP_PLANS[index % len(SWEEP_PLANS)],
            submit_at=chance.uniform(0, SWEEP_SHARE * window),
        )
        for index in range(options.sweeps)
    ]


# --- server teachers (small and in one place: how a job names a server may change) ------


SERVED_TEAM = "red"


def served_teacher_settings(api_urls: list[str]) -> dict[str, str]:
    """What the deployment's processes need for a job to name its own /v1 as a teacher
    server: each API's /v1 bound to "self", so a worker calls it with a short-lived token
    of the job's own team (signed under the secret key in the shared OPD_HOME), never a
    key of its environment."""
    return {"OPD_TEACHER_SERVERS": json.dumps({f"{url}/v1": "self" for url in api_urls})}


def served_teacher(api_url: str, source_job: int) -> dict[str, Any]:
    """A teacher on this service's own /v1, serving `source_job`'s final weights; retried
    for as long as a fault may keep the API or the database away."""
    server = {
        "url": f"{api_url}/v1",
        "model": f"job-{source_job}",
        "max_retries": 10,
        "retry_delay_seconds": 1.0,
    }
    return {"server": server}


def plan_served(options: argparse.Namespace, run_id: str) -> list[Order]:
    """A job of SERVED_TEAM, then --served jobs taught by it through the API once it
    succeeded (none without --served)."""
    if not options.served:
        return []
    steps = options.steps
    source = Order(
        team=SERVED_TEAM,
        spec=job_spec("on-policy", 1, steps) | {"name": "soak-served-source"},
        plan="run",
        submit_at=0.0,
        act_at_step=0,
        hold_seconds=0.0,
        key=f"soak-{run_id}-served-source",
    )
    taught = [
        Order(
            team=SERVED_TEAM,
            spec=job_spec("on-policy", 2 + index, steps) | {"name": f"soak-served-{index}"},
            plan="run",
            submit_at=0.0,
            act_at_step=0,
            hold_seconds=0.0,
            key=f"soak-{run_id}-served-{index}",
            taught_by=source,
        )
        for index in range(options.served)
    ]
    return [source, *taught]


# --- uploads ------------------------------------------------------------------------------------

MIB = 1 << 20
UPLOAD_TEAMS = ("files", "quota")  # each kind of file once; the burst (a team of its own,
# so that the quota it fills refuses none of the other files before they are read)
FILE_QUOTA = 3 * MIB  # OPD_TEAM_MAX_FILE_BYTES
MAX_UPLOAD = 4 * MIB  # OPD_MAX_UPLOAD_BYTES
BURST, BURST_BYTES = 5, 1_400_000  # uploads sent at once: 7 MB against the 3 MiB quota
UPLOAD_DROPS = 2  # dropped connections an upload is sent through (one that crashes an
# API would crash one each time); a 5xx (a store or database outage) is resent for as long
# as a client's REQUEST_PATIENCE
UPLOADS = (  # once each; then a burst of BURST
    "jsonl",
    "parquet",
    "deep-nesting",
    "parquet-bomb",
    "truncated-parquet",
    "utf-16",
    "invalid-utf-8",
    "huge-field",
)


@dataclass(kw_only=True)
class Upload:
    """One file a client of one of UPLOAD_TEAMS sends, and every answer it got."""

    team: str
    kind: str
    index: int
    send_at: float
    answers: list[int | str] = field(default_factory=list)
    """HTTP status of each try, or the transport error's name."""

    @property
    def filename(self) -> str:
        return f"{self.kind}-{self.index}.{'parquet' if 'parquet' in self.kind else 'jsonl'}"

    @property
    def final(self) -> int | str | None:
        return self.answers[-1] if self.answers else None


def parquet_bytes(columns: dict[str, list[Any]]) -> bytes:
    import io

    import pyarrow
    import pyarrow.parquet

    out = io.BytesIO()
    pyarrow.parquet.write_table(pyarrow.table(columns), out, compression="zstd")
    return out.getvalue()


def upload_bytes(upload: Upload, run_id: str) -> bytes:
    """The file's bytes, unique to the run and the upload (stored bytes are shared within a
    team: a repeat would be a 200)."""
    tag = f"{run_id}-{upload.kind}-{upload.index}"
    rows = [{"question": f"What is {n} + {n}? ({tag})", "answer": str(2 * n)} for n in range(8)]
    text = "".join(json.dumps(row) + "\n" for row in rows)
    kind = upload.kind
    if kind == "jsonl":
        return text.encode()
    if kind == "parquet" or kind == "truncated-parquet":
        data = parquet_bytes({key: [row[key] for row in rows] for key in ("question", "answer")})
        return data if kind == "parquet" else data[: len(data) // 2]
    if kind == "deep-nesting":  # about 200 KB that once crashed the reader
        return f'{{"tag": "{tag}", "question": '.encode() + b"[" * 100_000 + b"]" * 100_000 + b"}\n"
    if kind == "parquet-bomb":  # a few KB that inflate to 64 MiB
        return parquet_bytes({"question": [f"{tag} " + "a" * (8 * MIB)] * 8})
    if kind == "utf-16":
        return text.encode("utf-16")
    if kind == "invalid-utf-8":
        return text.encode() + b'{"question": "\xff\xfe\xc3\x28"}\n'
    if kind == "huge-field":
        return json.dumps({"question": f"{tag} " + "x" * (MAX_UPLOAD // 8)}).encode() + b"\n"
    assert kind == "burst"
    filler = "y" * (BURST_BYTES - len(text) - 100)
    return (text + json.dumps({"question": f"{tag} {filler}"}) + "\n").encode()


def plan_uploads(options: argparse.Namespace) -> list[Upload]:
    """Each kind of upload once at a random moment of the window, and BURST of them at
    one moment: a function of --seed."""
    chance = random.Random(options.seed + 3)
    window = options.minutes * 60 * SUBMIT_SHARE
    files, quota = UPLOAD_TEAMS
    uploads = [
        Upload(team=files, kind=kind, index=0, send_at=chance.uniform(0, window))
        for kind in UPLOADS
    ]
    burst_at = chance.uniform(0, window)
    burst = [Upload(team=quota, kind="burst", index=n, send_at=burst_at) for n in range(BURST)]
    return uploads + burst


# --- the clean runs ---------------------------------------------------------------------------


def clean_key(spec: dict[str, Any]) -> str:
    """What makes two specs train alike: all but the name, with the defaults filled in
    (so a trial's stored spec and a client's spec that say the same share a clean run)."""
    from kernel.spec import JobSpec

    full = JobSpec.model_validate(spec).model_dump(mode="json", exclude={"name"})
    return hashlib.sha256(json.dumps(full, sort_keys=True).encode()).hexdigest()[:16]


def clean_runs(specs: dict[str, dict[str, Any]], folder: Path) -> dict[str, dict[int, dict]]:
    """Each distinct spec (by its clean_key) run once by the engine alone: the rows every
    job and trial of it must equal."""
    from kernel.spec import JobSpec
    from worker.engine.loop.job import run_job
    from worker.engine.tracking.sinks import Sink

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
    store: Relay
    """The way every process reaches the S3 server: cut to take the object store away."""
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
        s3 = S3Server()
        stack.callback(s3.remove)
        s3.start()
        store = Relay(s3.port)
        stack.callback(store.cut)
        store.start()
        processes = Processes(home)
        stack.callback(processes.close)
        api_urls = [f"http://127.0.0.1:{free_port()}" for _ in range(APIS)]
        env = os.environ | {
            "PYTHONPATH": str(ROOT),
            "OPD_HOME": str(home / "opd"),
            "OPD_DATABASE_URL": postgres.url,
            "OPD_REDIS_URL": redis.url,
            "OPD_QUEUE_NAME": "opd-soak",
            "OPD_STORAGE_URL": s3.storage_url,
            **s3.env(store.url),
            "OPD_WORKER_CONCURRENCY": str(SLOTS),
            "OPD_HEARTBEAT_INTERVAL": "1",
            "OPD_HEARTBEAT_TIMEOUT": str(HEARTBEAT_TIMEOUT),
            "OPD_REQUEUE_INTERVAL": "2",
            "OPD_WEBHOOK_ALLOW_PRIVATE": "true",
            "OPD_WEBHOOK_POLL_INTERVAL": "0.5",
            "OPD_WEBHOOK_BACKOFF_SECONDS": "0.5",
            "OPD_WEBHOOK_BACKOFF_MAX_SECONDS": "5",
            "OPD_WEBHOOK_TIMEOUT": "5",
            "OPD_TEAM_MAX_FILE_BYTES": str(FILE_QUOTA),
            "OPD_MAX_UPLOAD_BYTES": str(MAX_UPLOAD),
        }
        service = Deployment(home, env, processes, postgres, redis, store)
        print(
            f"Deployment: OPD_HOME {home}, Postgres {postgres.folder}, Redis {redis.folder}",
            flush=True,
        )
        service.opd("migrate")
        service.admin_key = service.opd("keys", "create", "--team", "ops", "--scope", "admin")
        service.env |= served_teacher_settings(api_urls)
        for index, url in enumerate(api_urls):
            args = ["api", "--port", url.rsplit(":", 1)[1], "--quiet"]
            service.roles.append(Role(f"api-{index}", args, url))
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
        self.controllers_killed = 0

    def note(self, kind: str, target: str) -> None:
        self.injected.append(Fault(time.time(), kind, target))
        progress(f"fault: {FAULTS[kind]}: {target}")

    async def restart_later(self, role: Role, delay: float) -> None:
        await asyncio.sleep(delay)
        await asyncio.to_thread(self.service.restart, role)

    def live(self, kind: str) -> list[Role]:
        return [role for role in self.service.of(kind) if role.alive() and not role.down]

    async def controller(self) -> tuple[Role, list[int]] | None:
        """A live worker holding the lease of running sweeps, and those sweeps; waits up
        to CONTROLLER_WAIT for one (None: no sweep had a live controller)."""

        def leases() -> dict[int, list[int]]:
            with postgres_connection(self.service) as conn:
                rows = conn.execute(
                    "SELECT id, lease_owner FROM sweeps WHERE status = 'running'"
                    " AND lease_owner IS NOT NULL AND lease_until > now() ORDER BY id"
                ).fetchall()
            held: dict[int, list[int]] = defaultdict(list)
            for row in rows:
                held[int(row["lease_owner"].rsplit(":", 1)[1])].append(row["id"])
            return held

        deadline = time.monotonic() + CONTROLLER_WAIT
        while time.monotonic() < deadline:
            with suppress(psycopg.Error):
                held = await asyncio.to_thread(leases)
                for role in self.live("worker"):
                    if role.pid in held:
                        return role, held[role.pid]
            await asyncio.sleep(0.5)
        return None

    async def inject(self, kind: str) -> None:
        service, chance = self.service, self.chance
        if kind in ("kill-worker", "kill-controller", "term-worker", "kill-api"):
            controlling = await self.controller() if kind == "kill-controller" else None
            candidates = self.live("api" if kind == "kill-api" else "worker")
            if not candidates:
                return
            role = controlling[0] if controlling else chance.choice(candidates)
            target = f"{role.name} (pid {role.pid})"
            if kind == "kill-controller":
                held = f"sweeps {controlling[1]}" if controlling else "no sweep"
                target += f", controller of {held}"
                self.controllers_killed += controlling is not None
            role.down = True
            self.note(kind, target)
            process = role.command.process if role.command else None
            assert process is not None
            process.send_signal(signal.SIGTERM if kind == "term-worker" else signal.SIGKILL)
            await asyncio.to_thread(service.ended, role)
            delay = {"kill-worker": 10, "kill-controller": 10, "kill-api": 5}.get(kind, 0)
            self.restarts.append(
                asyncio.create_task(self.restart_later(role, delay * chance.random()))
            )
        elif kind == "restart-redis":
            self.note(kind, f"port {service.redis.port}")
            service.redis.stop()
            await asyncio.sleep(chance.uniform(0, 3))
            await asyncio.to_thread(service.redis.start)
        elif kind in ("restart-postgres", "outage-postgres"):
            self.note(kind, f"port {service.postgres.port}")
            await asyncio.to_thread(service.postgres.stop)
            away = POSTGRES_OUTAGE if kind == "outage-postgres" else chance.uniform(0, 3)
            await asyncio.sleep(away)
            await asyncio.to_thread(service.postgres.start)
        elif kind == "outage-store":
            seconds = chance.uniform(5, 15)
            self.note(kind, f"relay port {service.store.port} for {seconds:.1f} s")
            service.store.cut()
            await asyncio.sleep(seconds)
            service.store.start()
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

    async def attempt(
        self, team: str, method: str, path: str, **options: Any
    ) -> httpx.Response | None:
        """One request to the next API: its answer, or None for a transport error or a 5xx
        (both counted)."""
        headers = {"Authorization": f"Bearer {self.keys[team]}", **options.pop("headers", {})}
        urls = self.service.api_urls
        self.turn += 1
        url = urls[self.turn % len(urls)]
        try:
            response = await self.http.request(
                method, f"{url}{path}", headers=headers, timeout=30, **options
            )
        except httpx.TransportError:
            self.traffic.transport_errors += 1
            return None
        if response.status_code >= 500:
            self.traffic.server_errors[response.status_code] += 1
            return None
        return response

    async def call(self, team: str, method: str, path: str, **options: Any) -> httpx.Response:
        """The first answer below 500 (429 is waited out), from whichever API answers;
        transport errors and 5xx are retried."""
        deadline = time.monotonic() + REQUEST_PATIENCE
        tries = 0
        while True:
            response = await self.attempt(team, method, path, **options)
            if response is not None and response.status_code == 429:  # a full queue: no fault
                self.traffic.throttled += 1
                deadline = time.monotonic() + REQUEST_PATIENCE
            elif response is not None:
                return response
            if time.monotonic() > deadline:
                raise ClientGaveUp(f"{method} {path} found no answer in {REQUEST_PATIENCE:.0f} s")
            tries += 1
            await asyncio.sleep(min(3.0, 0.1 * 2**tries))

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
        if order.taught_by is not None:
            await self.teach_from_server(order)
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

    async def run(self, order: Order | SweepOrder, driving: Awaitable[None]) -> None:
        """Drive one job or sweep; a client that gives up notes why."""
        try:
            await driving
        except (ClientGaveUp, httpx.HTTPStatusError) as error:
            order.error = str(error)
            progress(f"{order.label}: {error}")

    async def sweep(self, order: SweepOrder, until: Callable[[dict], bool]) -> dict[str, Any]:
        """The sweep as GET /v1/sweeps/{id} shows it, once `until` holds."""
        while True:
            response = await self.call(order.team, "GET", f"/v1/sweeps/{order.sweep_id}")
            response.raise_for_status()
            if until(sweep := response.json()):
                return sweep
            await asyncio.sleep(POLL_SECONDS)

    async def create_sweep(self, order: SweepOrder) -> int:
        """POST the sweep with one Idempotency-Key, resent until answered: a try whose
        answer was lost made the sweep that a later one is answered with (200)."""
        key = {"Idempotency-Key": f"soak-{order.name}"}
        answer = await self.call(
            order.team, "POST", "/v1/sweeps", json=order.definition, headers=key
        )
        if answer.status_code not in (200, 201):
            raise ClientGaveUp(f"sweep answered {answer.status_code}: {answer.text[:200]}")
        if answer.status_code == 201:
            order.answers.append(("sweep.create", 201))
        return answer.json()["id"]

    async def teach_from_server(self, order: Order) -> None:
        """Wait for the job whose weights teach this one to succeed, and make the service's
        own /v1, serving them, its teacher."""
        source = order.taught_by
        assert source is not None
        while not source.job_ids:
            if source.error or source.final:
                raise ClientGaveUp(f"its teacher's job was not submitted: {source.error}")
            await asyncio.sleep(POLL_SECONDS)
        (source_id,) = source.job_ids
        done = await self.wait(source, source_id, lambda job: job["status"] in TERMINAL)
        if done["status"] != "succeeded":
            raise ClientGaveUp(f"its teacher's job {source_id} ended {done['status']}")
        order.spec = order.spec | {"teacher": served_teacher(self.service.api_urls[0], source_id)}

    async def upload(self, upload: Upload, run_id: str, started: float) -> None:
        """POST the file as its team, resent (the same bytes: a lost answer's repeat is a
        200) after a 5xx, or after a dropped connection up to UPLOAD_DROPS times."""
        await asyncio.sleep(max(0.0, started + upload.send_at - time.monotonic()))
        data = await asyncio.to_thread(upload_bytes, upload, run_id)
        deadline = time.monotonic() + REQUEST_PATIENCE
        while True:
            self.turn += 1
            url = self.service.api_urls[self.turn % len(self.service.api_urls)]
            try:
                response = await self.http.post(
                    f"{url}/v1/files",
                    params={"filename": upload.filename},
                    content=data,
                    headers={"Authorization": f"Bearer {self.keys[upload.team]}"},
                    timeout=120,
                )
            except httpx.TransportError as error:
                upload.answers.append(type(error).__name__)
            else:
                upload.answers.append(response.status_code)
                if response.status_code < 500:
                    return
            dropped = sum(isinstance(answer, str) for answer in upload.answers)
            if dropped >= UPLOAD_DROPS or time.monotonic() > deadline:
                return
            await asyncio.sleep(2.0)

    async def drive_sweep(self, order: SweepOrder, started: float) -> None:
        await asyncio.sleep(max(0.0, started + order.submit_at - time.monotonic()))
        order.sweep_id = await self.create_sweep(order)
        if order.plan == "cancel":
            half = order.definition["base"]["loop"]["steps"] // 2
            await self.sweep(
                order,
                lambda sweep: (
                    sweep["status"] != "running"
                    or any(trial["steps_done"] >= half for trial in sweep["trials"])
                ),
            )
            path = f"/v1/sweeps/{order.sweep_id}/cancel"
            response = await self.call(order.team, "POST", path)
            order.answers.append(("sweep.cancel", response.status_code))
            response.raise_for_status()
            order.expected = response.json()["status"]  # completed if it ended first
        sweep = await self.sweep(
            order,
            lambda sweep: (
                sweep["status"] != "running"
                and all(trial["status"] in TERMINAL for trial in sweep["trials"])
            ),
        )
        order.final = sweep["status"]
        order.trials = {trial["job_id"]: trial["status"] for trial in sweep["trials"]}


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
    sweeps: dict[int, dict[str, Any]]
    file_bytes: dict[str, int]
    """Bytes of uploaded files each team holds."""

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
            sweeps = {row["id"]: row for row in conn.execute("SELECT * FROM sweeps")}
            held = conn.execute(
                "SELECT teams.name, sum(files.bytes) AS bytes FROM files JOIN teams"
                " ON teams.id = files.team_id GROUP BY teams.name"
            )
            file_bytes = {row["name"]: int(row["bytes"]) for row in held}
            return cls(jobs, events, steps, audit.fetchall(), sweeps, file_bytes)

    def job(self, order: Order) -> dict[str, Any] | None:
        return self.jobs.get(next(iter(order.job_ids))) if order.job_ids else None

    def trials(self, sweep_id: int | None = None) -> list[dict[str, Any]]:
        """The trial jobs of one sweep (of every sweep: None), by sweep and trial number."""
        found = [
            job
            for job in self.jobs.values()
            if job["sweep_id"] is not None and sweep_id in (None, job["sweep_id"])
        ]
        return sorted(found, key=lambda job: (job["sweep_id"], job["sweep_trial"]))

    def sweep(self, order: SweepOrder) -> dict[str, Any] | None:
        return self.sweeps.get(order.sweep_id) if order.sweep_id is not None else None

    def timeline(self, job_id: int) -> str:
        return " | ".join(event["message"][:70] for event in self.events[job_id])

    def count(self, matches: Callable[[str], Any]) -> int:
        return sum(1 for job in self.events.values() for e in job if matches(e["message"]))


def check_ends(orders: list[Order], db: Snapshot, setup: set[int]) -> list[Check]:
    """Of the clients' jobs; `setup` are the jobs the soak submitted itself (the budget
    team's), which no client sent."""
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
                f"job {job['id']} ({order.spec_name}, {order.plan}, answers {order.answers}): "
                f"{job['status']}{error}, expected {order.expected}; {db.timeline(job['id'])}"
            )
        if len(order.job_ids) > 1 or per_key[order.key] > 1:
            doubled.broken(f"{order.key}: jobs {sorted(order.job_ids)}")
    keys = {order.key for order in orders}
    for job_id, job in db.jobs.items():
        if job["idempotency_key"] not in keys and job["sweep_id"] is None and job_id not in setup:
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


def check_steps(
    noun: str,
    runs: list[tuple[dict[str, Any], str]],
    db: Snapshot,
    curves: dict[str, dict],
    serving: set[int],
) -> list[Check]:
    """Of each (job, clean_key of the spec it should have run): a succeeded job's rows are
    the clean run's steps, a stopped one's the first ones; every value equals the clean
    run's; a succeeded job's usage is the clean run's, unless the job is `serving` (its
    weights a server teacher's: their scoring is counted in its usage too)."""
    rows_wrong = Check(f"{noun} step rows not exactly its steps", out_of=len(runs))
    differing = Check(f"{noun} values differing from a clean run, bit for bit", out_of=0)
    usage_wrong = Check(f"{noun} usage totals differing from a clean run", out_of=0)
    for job, key in runs:
        clean, rows = curves[key], db.steps[job["id"]]
        succeeded = job["status"] == "succeeded"
        expected = sorted(clean) if succeeded else list(range(len(rows)))
        if sorted(rows) != expected or not rows.keys() <= clean.keys():
            rows_wrong.broken(f"job {job['id']} ({job['status']}): steps {sorted(rows)}")
        differences = []
        for step in sorted(rows.keys() & clean.keys()):
            want = {k: v for k, v in clean[step].items() if compared(k)}
            have = {k: v for k, v in rows[step].items() if compared(k)}
            differing.chance(len(want))
            differences += [
                f"step {step} {key}: {have.get(key)!r} != {want.get(key)!r}"
                for key in sorted(want.keys() | have.keys())
                if want.get(key) != have.get(key)
            ]
        if differences:  # one example a job, with its story: which run made the rows
            differing.broken(
                f"job {job['id']} ({job['name']}, {len(differences)} values, first "
                f"{differences[0]}): {db.timeline(job['id'])}",
                times=len(differences),
            )
        if succeeded and job["id"] not in serving:
            usage_wrong.chance()
            have_usage = {name: job[name] for name in USAGE}
            if have_usage != usage_of(clean):
                usage_wrong.broken(f"job {job['id']}: {have_usage} != {usage_of(clean)}")
    return [rows_wrong, differing, usage_wrong]


def planned_trials(definition: dict[str, Any]) -> int:
    if definition["method"] == "grid":
        return math.prod(len(p["values"]) for p in definition["parameters"].values())
    return definition["max_trials"]


def fits(trial: dict[str, Any], sweep: dict[str, Any]) -> bool:
    """Whether a trial ended as a trial of that sweep may: succeeded, stopped early by
    it, or cancelled with it."""
    if trial["status"] == "succeeded":
        return True
    stopped = trial["stop_reason"] == EARLY_STOPPED or sweep["status"] == "cancelled"
    return trial["status"] == "cancelled" and stopped


def check_sweeps(sweep_orders: list[SweepOrder], db: Snapshot) -> list[Check]:
    """Each sweep ended as its client asked, once, with its trials ended as its trials
    may and (completed) all of them run; no trial number repeats within a sweep; no trial
    was created after its sweep ended."""
    trials = db.trials()
    wrong = Check("every sweep reached the end its client asked for", out_of=len(sweep_orders))
    repeated = Check("trial numbers repeated within a sweep", out_of=len(trials))
    late = Check("trials created after their sweep ended", out_of=len(trials))
    per_name = Counter(sweep["name"] for sweep in db.sweeps.values())
    for order in sweep_orders:
        sweep = db.sweep(order)
        if order.error or sweep is None or sweep["status"] == "running":
            wrong.broken(f"{order.name}: {order.error or (sweep or {}).get('status', 'missing')}")
            continue
        mine = db.trials(sweep["id"])
        problems = [f"trial {t['sweep_trial']} {t['status']}" for t in mine if not fits(t, sweep)]
        if sweep["status"] != order.expected or order.final != sweep["status"]:
            problems.append(
                f"{sweep['status']} ({sweep['error_message']}), expected {order.expected}"
            )
        if per_name[order.name] > 1:
            problems.append(f"{per_name[order.name]} sweeps of this name")
        if sweep["status"] == "completed" and len(mine) != planned_trials(order.definition):
            problems.append(f"{len(mine)} trials of {planned_trials(order.definition)}")
        if problems:
            wrong.broken(f"sweep {sweep['id']} ({order.plan}): {'; '.join(problems)}")
    for sweep_id, sweep in db.sweeps.items():
        mine = db.trials(sweep_id)
        numbers = Counter(trial["sweep_trial"] for trial in mine)
        for number, times in sorted(numbers.items()):
            if times > 1:
                repeated.broken(f"sweep {sweep_id}: trial {number} x{times}", times - 1)
        ended = sweep["finished_at"]
        for trial in mine:
            if ended is not None and trial["created_at"] > ended:
                after = (trial["created_at"] - ended).total_seconds()
                late.broken(
                    f"sweep {sweep_id} ({sweep['status']}): trial {trial['sweep_trial']} (job "
                    f"{trial['id']}) created {after:.1f} s after its end, {trial['status']} "
                    f"after {trial['steps_done']} steps"
                )
    return [wrong, repeated, late]


def teams_jobs(
    orders: list[Order], sweep_orders: list[SweepOrder], db: Snapshot
) -> list[tuple[str, dict[str, Any]]]:
    """(team, job) of every client's job and every trial of a client's sweep."""
    jobs = [(order.team, job) for order in orders if (job := db.job(order)) is not None]
    return jobs + [
        (order.team, trial)
        for order in sweep_orders
        if order.sweep_id is not None
        for trial in db.trials(order.sweep_id)
    ]


def check_webhooks(
    jobs: list[tuple[str, dict[str, Any]]], receivers: dict[str, Receiver]
) -> tuple[list[Check], int]:
    """Each ended job's (and trial's) terminal event reached its team's receiver, under
    one webhook-id. Returns the checks and how many deliveries were repeats (at least
    once, as designed)."""
    missing = Check("terminal webhook events not received", out_of=0)
    doubled = Check("terminal webhook events received under two webhook-ids", out_of=0)
    repeats = 0
    for team, job in jobs:
        if job["status"] not in TERMINAL:
            continue
        event = f"job.{job['status']}"
        receiver = receivers[team]
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


def check_audit(orders: list[Order], sweep_orders: list[SweepOrder], db: Snapshot) -> Check:
    """Every job has its `job.create` row and every sweep its `sweep.create` row, every
    change an API action made to a job (its timeline entry) has its row, and every request
    the clients saw answered 200 has its row. A trial's rows are its sweep's."""
    unaudited = Check("actions without their audit row", out_of=0)
    changes: Counter[tuple[str, str]] = Counter()
    requests: Counter[tuple[str, str]] = Counter()
    for entry in db.audit:
        action, target = entry["action"].removeprefix("job."), entry["target"]
        requests[(action, target)] += 1
        detail = as_dict(entry["detail"]) if entry["detail"] is not None else {}
        created = action in ("create", "sweep.create") and entry["status_code"] == 201
        if created or detail.get("changed"):
            changes[(action, target)] += 1
    made: Counter[tuple[str, str]] = Counter()
    for job_id, job in db.jobs.items():
        if job["sweep_id"] is not None:
            continue
        made[("create", f"job {job_id}")] += 1
        for event in db.events[job_id]:
            for action, entries in ACTION_EVENTS.items():
                made[(action, f"job {job_id}")] += event["message"].startswith(entries)
    for sweep_id in db.sweeps:
        made[("sweep.create", f"sweep {sweep_id}")] += 1
    answered = Counter(
        (action, f"job {job['id']}")
        for order in orders
        if (job := db.job(order)) is not None
        for action, status in order.answers
        if status == 200 and action != "submit"  # a repeated submit (200) changes nothing
    )
    answered += Counter(
        (action, f"sweep {order.sweep_id}")
        for order in sweep_orders
        for action, status in order.answers
        if status == 200
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


def served_jobs(orders: list[Order]) -> set[int]:
    """The jobs whose weights a server teacher served (their usage counts that scoring)."""
    return {job_id for order in orders if order.taught_by for job_id in order.taught_by.job_ids}


def check_served(orders: list[Order], db: Snapshot) -> Check:
    """A job taught by a server that succeeded ran each of its steps once."""
    served = [job for order in orders if order.taught_by and (job := db.job(order))]
    wrong = Check("server-taught job step rows not exactly its steps", out_of=len(served))
    for job in served:
        steps = sorted(db.steps[job["id"]])
        if job["status"] == "succeeded" and steps != list(range(job["total_steps"])):
            wrong.broken(f"job {job['id']}: steps {steps}; {db.timeline(job['id'])}")
    return wrong


def check_uploads(uploads: list[Upload], db: Snapshot) -> list[Check]:
    """Every upload was answered 201 (200: bytes the team stored already) or a 4xx, in
    the end; no team holds more file bytes than its quota."""
    answered = Check("uploads answered neither 201 nor a 4xx", out_of=len(uploads))
    for upload in uploads:
        final = upload.final
        if not (isinstance(final, int) and (final in (200, 201) or 400 <= final < 500)):
            answered.broken(f"{upload.filename}: {upload.answers}")
    over = Check("teams holding more file bytes than their quota", out_of=len(db.file_bytes))
    for team, held in sorted(db.file_bytes.items()):
        if held > FILE_QUOTA:
            over.broken(f"{team}: {held} bytes, quota {FILE_QUOTA}")
    return [answered, over]


def check_limits(peaks: dict[str, int]) -> Check:
    over = Check("team limits exceeded (most jobs running at once)", out_of=len(TEAMS))
    for team, limits in TEAMS.items():
        if peaks.get(team, 0) > limits.get("max_running", float("inf")):
            over.broken(f"{team}: {peaks[team]} running at once, limit {limits['max_running']}")
    return over


@dataclass
class Findings:
    checks: list[Check]
    end_states: dict[str, Counter[str]]
    """Jobs, sweeps and trials by their end state."""
    figures: dict[str, Any]

    @property
    def passed(self) -> bool:
        return all(check.passed for check in self.checks)


def check_all(
    service: Deployment,
    db: Snapshot,
    orders: list[Order],
    sweep_orders: list[SweepOrder],
    uploads: list[Upload],
    curves: dict[str, dict[int, dict]],
    receivers: dict[str, Receiver],
    peaks: dict[str, int],
    setup: set[int],
) -> Findings:
    jobs = [
        (job, clean_key(order.spec))
        for order in orders
        if order.taught_by is None and (job := db.job(order))
    ]
    trials = db.trials()
    trial_runs = [(trial, clean_key(as_dict(trial["spec"]))) for trial in trials]
    webhooks, repeats = check_webhooks(teams_jobs(orders, sweep_orders, db), receivers)
    crashed = Check("processes that exited without a fault")
    for exit in service.unplanned_exits:
        crashed.broken(exit)
    checks = [
        *check_ends(orders, db, setup),
        check_attempts(service, db),
        *check_steps("job", jobs, db, curves, served_jobs(orders)),
        *check_sweeps(sweep_orders, db),
        *check_steps("trial", trial_runs, db, curves, set()),
        *webhooks,
        check_served(orders, db),
        check_audit(orders, sweep_orders, db),
        check_limits(peaks),
        *check_uploads(uploads, db),
        crashed,
    ]
    stopped = [trial for trial in trials if trial["stop_reason"] == EARLY_STOPPED]
    figures = {
        "attempts": sum(job["attempts"] for job in db.jobs.values()),
        "resumed": db.count(lambda message: message.startswith("Resumed from")),
        "takeovers": db.count(TAKEOVER.match),
        "requeued": db.count(lambda message: message.startswith("Requeued")),
        "webhook repeats": repeats,
        "peaks": dict(peaks),
        "trials": len(trials),
        "steps saved": sum(trial["total_steps"] - trial["steps_done"] for trial in stopped),
        "uploads": Counter(f"{upload.kind} {upload.final}" for upload in uploads),
    }
    ends = {
        "jobs": Counter(job["status"] for order in orders if (job := db.job(order))),
        "sweeps": Counter(sweep["status"] for sweep in db.sweeps.values()),
        "trials": Counter(
            "stopped early" if trial in stopped else trial["status"] for trial in trials
        ),
    }
    return Findings(checks, ends, figures)


# --- a team with a budget that runs out mid-soak (issue 41) -----------------------------------

BUDGET_TEAM = "gold"
BUDGET_JOBS = 3
BUDGET_SHARE = 0.5
"""The budget buys this share of the steps of the team's jobs, which all start at once."""
BUDGET_SETTLE_SECONDS = 300.0


@dataclass
class BudgetTeam:
    """A fourth team, with a token budget that runs out mid-soak: its jobs must pause at a
    step boundary (state saved there), the team must spend at most its limit plus one step
    per running job, and no other team's job may be touched. Self-contained: `start` after
    the other teams exist, `checks` on the snapshot once the soak is over."""

    limit: int
    step_tokens: int
    """The most tokens one step of its jobs uses (from a clean run)."""
    job_ids: list[int]

    @classmethod
    def start(cls, service: Deployment, steps: int, folder: Path) -> BudgetTeam:
        admin = service.admin_key
        key = setup_call(service, admin, "POST", "/v1/keys", {"team": BUDGET_TEAM})["key"]
        specs = [job_spec("on-policy", 900 + n, steps) for n in range(BUDGET_JOBS)]
        rows = next(iter(clean_runs({clean_key(specs[0]): specs[0]}, folder).values()))
        per_step = [
            sum(int(row.get(f"usage/{name}", 0)) for name in USAGE) for row in rows.values()
        ]
        limit = int(sum(per_step) * BUDGET_JOBS * BUDGET_SHARE)
        setup_call(service, admin, "PUT", f"/v1/teams/{BUDGET_TEAM}/budget", {"tokens": limit})
        job_ids = [setup_call(service, key, "POST", "/v1/jobs", spec)["id"] for spec in specs]
        return cls(limit, max(per_step), job_ids)

    def settle(self, service: Deployment) -> None:
        """Wait until none of the team's jobs runs or waits any more (paused or ended)."""
        deadline = time.monotonic() + BUDGET_SETTLE_SECONDS
        with postgres_connection(service) as conn:
            while time.monotonic() < deadline:
                active = conn.execute(
                    "SELECT count(*) AS n FROM jobs WHERE id = ANY(%s) AND status IN "
                    "('queued', 'running', 'pausing', 'cancelling')",
                    (self.job_ids,),
                ).fetchone()
                if not active["n"]:
                    return
                time.sleep(1)

    def checks(self, db: Snapshot) -> list[Check]:
        jobs = [db.jobs[job_id] for job_id in self.job_ids]
        spent = sum(job[name] for job in jobs for name in USAGE)
        overshoot = Check("budget overshoot past one step per running job (tokens)", out_of=1)
        if spent - self.limit > BUDGET_JOBS * self.step_tokens:
            overshoot.broken(
                f"{BUDGET_TEAM} spent {spent} of {self.limit}: {spent - self.limit} over, more "
                f"than {BUDGET_JOBS} steps of {self.step_tokens}"
            )
        paused = Check("budget jobs not paused at a step boundary", out_of=len(jobs))
        for job in jobs:
            if job["status"] == "succeeded":  # it ended before the budget ran out
                continue
            # A job the budget stopped before its first step is paused at step 0, with
            # nothing to save.
            never_ran = job["steps_done"] == 0 and job["last_state_step"] is None
            at_boundary = never_ran or job["last_state_step"] == job["steps_done"]
            if not (job["status"] == "paused" and job["stop_reason"] == "budget" and at_boundary):
                where = f"state {job['last_state_step']}, {job['stop_reason']}"
                paused.broken(f"job {job['id']}: {job['status']} at {job['steps_done']} ({where})")
        if not any(job["stop_reason"] == "budget" for job in jobs):
            paused.broken(f"no job of {BUDGET_TEAM} was paused: the budget never ran out")
        others = [job for job in db.jobs.values() if job["id"] not in self.job_ids]
        touched = Check("other teams' jobs touched by the budget", out_of=len(others))
        for job in others:
            if job["stop_reason"] == "budget" or "budget" in db.timeline(job["id"]):
                touched.broken(f"job {job['id']}: {db.timeline(job['id'])}")
        over = (spent - self.limit) / self.step_tokens
        progress(
            f"budget team {BUDGET_TEAM}: limit {self.limit}, spent {spent} ({over:+.2f} steps)"
        )
        return [overshoot, paused, touched]


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
    sweep_orders: list[SweepOrder],
    uploads: list[Upload],
    keys: dict[str, str],
    options: argparse.Namespace,
    run_id: str,
) -> tuple[Chaos, Traffic]:
    chance = random.Random(options.seed + 1)
    chaos = Chaos(service, chance)
    window = options.minutes * 60
    done = asyncio.Event()
    watcher = asyncio.create_task(supervise(service, done))
    async with httpx.AsyncClient() as http:
        clients = Clients(service, keys, http)
        started = time.monotonic()
        driving = asyncio.gather(
            *(clients.run(order, clients.drive(order, started)) for order in orders),
            *(clients.run(order, clients.drive_sweep(order, started)) for order in sweep_orders),
            *(clients.upload(upload, run_id, started) for upload in uploads),
        )
        await chaos.run(options.kinds, window, options.faults)
        progress(f"{len(chaos.injected)} faults injected; waiting for the jobs and sweeps to end")
        try:
            await asyncio.wait_for(driving, DRAIN_TIMEOUT)
        except TimeoutError:
            progress(f"jobs still running {DRAIN_TIMEOUT:.0f} s after the faults stopped")
    done.set()
    await watcher
    return chaos, clients.traffic


def wait_for_webhooks(
    orders: list[Order], sweep_orders: list[SweepOrder], receivers: dict[str, Receiver]
) -> None:
    """Until each ended job's and trial's terminal event arrived, or WEBHOOK_TIMEOUT
    passes."""
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
        } | {
            (order.team, job_id, f"job.{status}")
            for order in sweep_orders
            for job_id, status in order.trials.items()
        }
        if due <= arrived:
            return
        time.sleep(0.5)


def trial_specs(db: Snapshot) -> dict[str, dict[str, Any]]:
    """The distinct specs the trials ran, as the controller stored them."""
    specs = [as_dict(trial["spec"]) for trial in db.trials()]
    return {clean_key(spec): spec for spec in specs}


def run(options: argparse.Namespace) -> tuple[list[Fault], Findings, Traffic]:
    window = options.minutes * 60
    run_id = f"{os.getpid()}"
    orders = plan_orders(options, run_id) + plan_served(options, run_id)
    sweep_orders = plan_sweeps(options)
    uploads = plan_uploads(options)
    specs = {clean_key(order.spec): order.spec for order in orders if order.taught_by is None}
    with ExitStack() as stack:
        home = stack.enter_context(scratch_home())
        progress(f"clean runs of the jobs' {len(specs)} distinct specs (the engine alone)")
        began = time.monotonic()
        curves = clean_runs(specs, home / "clean")
        clean_seconds = time.monotonic() - began
        progress("starting the deployment: Postgres, Redis, S3, 2 APIs, 3 workers")
        service = stack.enter_context(deployment(home))
        receivers = {team: Receiver() for team in TEAMS}
        keys = {}
        for team, limits in TEAMS.items():
            server = stack.enter_context(Server(receivers[team]))
            keys[team], receivers[team].secret = create_team(service, team, limits, server.url)
        for team in UPLOAD_TEAMS:
            body = {"team": team}
            keys[team] = setup_call(service, service.admin_key, "POST", "/v1/keys", body)["key"]
        progress(
            f"{len(orders)} jobs over {window * SUBMIT_SHARE:.0f} s ({options.served} taught by "
            f"a server), {len(sweep_orders)} sweeps over {window * SWEEP_SHARE:.0f} s, "
            f"{len(uploads)} uploads, {options.faults} faults over {window:.0f} s"
        )
        budgeted = BudgetTeam.start(service, options.steps, home / "clean")
        began = time.monotonic()
        with running_peaks(service) as peaks:
            chaos, traffic = asyncio.run(
                soak(service, orders, sweep_orders, uploads, keys, options, run_id)
            )
        soak_seconds = time.monotonic() - began
        wait_for_webhooks(orders, sweep_orders, receivers)
        budgeted.settle(service)
        db = Snapshot.read(service)
        unrun = {key: spec for key, spec in trial_specs(db).items() if key not in curves}
        progress(f"clean runs of the trials' {len(unrun)} other distinct specs")
        began = time.monotonic()
        curves |= clean_runs(unrun, home / "clean")
        clean_seconds += time.monotonic() - began
        findings = check_all(
            service,
            db,
            orders,
            sweep_orders,
            uploads,
            curves,
            receivers,
            dict(peaks),
            set(budgeted.job_ids),
        )
        findings.checks += budgeted.checks(db)
        findings.figures |= {
            "clean seconds": clean_seconds,
            "soak seconds": soak_seconds,
            "controllers killed": chaos.controllers_killed,
        }
        if not findings.passed:
            print(report(options, chaos.injected, findings, traffic))
            raise ChecksFailed
    return chaos.injected, findings, traffic


class ChecksFailed(Exception):
    """A check failed: the table above says which."""


def report(
    options: argparse.Namespace, faults: list[Fault], findings: Findings, traffic: Traffic
) -> str:
    lines = [
        f"Chaos soak: {options.jobs} jobs and {options.sweeps} sweeps, {options.minutes:g} min "
        f"of faults, seed {options.seed}",
        "",
        f"{'Faults injected':<58} {'count':>7}",
    ]
    counts = Counter(fault.kind for fault in faults)
    for kind, text in FAULTS.items():
        if kind in options.kinds:
            lines.append(f"  {text:<56} {counts[kind]:>7}")
    lines.append(f"  {'total':<56} {len(faults):>7}")
    for what, ends in findings.end_states.items():
        lines += ["", f"{what.capitalize() + ' by end state':<58} {'count':>7}"]
        for status, count in sorted(ends.items()):
            label = status if what == "jobs" else f"{what} {status}"
            lines.append(f"  {label:<56} {count:>7}")
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
        f"Sweeps' trials {figures['trials']}, steps early stopping saved "
        f"{figures['steps saved']}; workers killed while controlling a sweep "
        f"{figures['controllers killed']}",
        "Uploads by their last answer: "
        + ", ".join(f"{what} x{n}" for what, n in sorted(figures["uploads"].items())),
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
    parser.add_argument(
        "--sweeps", type=int, default=6, help="sweeps of 4 trials, half cancelled midway (6)"
    )
    parser.add_argument(
        "--served", type=int, default=2, help="jobs taught by the service's own /v1 (2)"
    )
    parser.add_argument("--steps", type=int, default=30, help="steps of every job (30)")
    parser.add_argument("--seed", type=int, default=0, help="the jobs, their plans and faults")
    options = parser.parse_args(argv)
    options.kinds = options.kinds.split(",")
    if unknown := set(options.kinds) - FAULTS.keys():
        parser.error(f"--kinds: unknown {', '.join(sorted(unknown))}")
    if options.jobs < 1 or min(options.sweeps, options.served) < 0 or options.minutes <= 0:
        parser.error("--jobs and --minutes must be positive, --sweeps and --served not negative")
    if options.steps < 10:
        parser.error("--steps must be at least 10")
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
