"""A fleet on one machine: N API processes and M workers on one Postgres and one Redis, K
jobs from T teams at once, D dashboards reading running jobs' charts meanwhile; then a
worker and an API process killed mid-run, and nothing lost.

The workers run the remote backend (`trio`) on the tests' fake (benchmarks/
fake_trio_worker.py), each request taking --latency seconds, so a job waits on a remote
service as it would and the fleet is bound by the service's own work, not by a model's.
It prints, and writes with --json:

- jobs dispatched per second (starts over the span from the first to the last start) and
  the p50/p99 wait from created to running;
- each team's share of the running slots against its fair share (the slots in use over
  the teams with jobs waiting), sampled every second while every team has a job queued;
- Postgres: commits per second (`pg_stat_database.xact_commit` of the run's database) and
  the CPU of its backends (from /proc), over the run;
- the dashboards' p50/p99: each polls, every --poll-seconds, a running job of its team:
  the job and its chart (`/metrics?keys=...&max_points=500`) at once, on two keep-alive
  connections, latency counted from the scheduled send; a dashboard whose API process
  died moves to the next one, as a load balancer would send it;
- each process's memory (RSS) and CPU.

Each process's Postgres pool is --db-pool-size plus --db-max-overflow connections (a worker
has two engines: its jobs' and its sweep controller's), small by default so that a fleet
fits a Postgres's 100 connections; it warns when the pools could open more than the server
has free.

Once a third of the jobs have ended, one worker and one API process are killed (SIGKILL).
Then it checks that nothing was lost: every job succeeded (the killed worker's jobs taken
over once their heartbeat is older than OPD_HEARTBEAT_TIMEOUT), each job has one row, and
each has exactly its steps' rows, no step missing or extra. Exits 1 when a check fails
(the logs are kept), 130 on Ctrl-C; everything it started is stopped and removed.

    python benchmarks/fleet.py                                  # 4 APIs, 16 workers, 1,000 jobs
    python benchmarks/fleet.py --apis 2 --workers 4 --jobs 60 --teams 6 --dashboards 10
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import psycopg
from harness import (
    BenchmarkError,
    Command,
    HttpConnection,
    Processes,
    cell,
    latency_summary,
    opd,
    positive,
    postgres_database,
    progress,
    redis_queue,
    run_benchmark,
    sleep_until,
)
from load_jobs import RequestStats, send
from support import free_port, percentile

ROOT = Path(__file__).resolve().parents[1]
CHART = "keys=opd/reverse_kl_mean,trainer/loss_mean&max_points=500"
HEARTBEAT_TIMEOUT = 15.0  # how soon the killed worker's jobs are taken over
REQUEUE_INTERVAL = 3.0
SAMPLE_SECONDS = 1.0
WORKER_ENGINES = 2  # a worker's database engines: its jobs' and its sweep controller's
KILL_AFTER = 1 / 3  # share of the jobs ended when a worker and an API process are killed
PROMPTS = ["What is 2 + 3?", "Name a prime.", "Is 9 a square?", "What is 12 / 4?"]


def job_spec(team: str, index: int, steps: int) -> dict[str, Any]:
    """A small remote job: --steps steps of 2 prompts x 2 completions of up to 8 tokens."""
    return {
        "name": f"fleet-{team}-{index}",
        "backend": "trio",
        "student": {"base_model": "fleet/student", "lora_rank": 8, "seed": index},
        "teacher": {"base_model": "fleet/teacher"},
        "dataset": {"source": "inline", "prompts": PROMPTS, "question_suffix": ""},
        "sampling": {"max_tokens": 8},
        "loop": {"steps": steps, "batch_size": 2, "group_size": 2},
    }


# --- the deployment ---------------------------------------------------------------------------


@dataclass
class Fleet:
    processes: Processes
    env: dict[str, str]
    database_url: str
    apis: list[Command] = field(default_factory=list)
    ports: list[int] = field(default_factory=list)
    workers: list[Command] = field(default_factory=list)
    killed: list[str] = field(default_factory=list)

    def url(self, index: int) -> str:
        return f"http://127.0.0.1:{self.ports[index % len(self.ports)]}"


@contextmanager
def scratch_home() -> Iterator[Path]:
    """OPD_HOME (logs): removed after a clean run, kept after a failure."""
    home = Path(tempfile.mkdtemp(prefix="opd-fleet-"))
    try:
        yield home
    except BaseException as error:
        if not isinstance(error, KeyboardInterrupt):
            print(f"Logs kept in {home}", file=sys.stderr)
            raise
        shutil.rmtree(home, ignore_errors=True)
        raise
    shutil.rmtree(home, ignore_errors=True)


@contextmanager
def fleet(options: argparse.Namespace) -> Iterator[Fleet]:
    with ExitStack() as stack:
        database_url = stack.enter_context(postgres_database())
        queue = stack.enter_context(redis_queue(options.redis_url))
        home = stack.enter_context(scratch_home())
        processes = Processes(home)
        stack.callback(processes.close)
        env = os.environ | {
            "PYTHONPATH": str(ROOT),
            "OPD_HOME": str(home),
            "OPD_DATABASE_URL": database_url,
            "OPD_REDIS_URL": options.redis_url,
            "OPD_QUEUE_NAME": queue,
            "OPD_WORKER_CONCURRENCY": str(options.concurrency),
            "OPD_DB_POOL_SIZE": str(options.db_pool_size),
            "OPD_DB_MAX_OVERFLOW": str(options.db_max_overflow),
            "OPD_HEARTBEAT_TIMEOUT": str(HEARTBEAT_TIMEOUT),
            "OPD_REQUEUE_INTERVAL": str(REQUEUE_INTERVAL),
            "OMP_NUM_THREADS": "1",
        }
        warn_if_pools_overflow(database_url, connection_ceiling(options))
        service = Fleet(processes, env, database_url)
        opd(env, "migrate")
        for index in range(options.apis):
            port = free_port()
            argv = [sys.executable, "-m", "opd.cli", "api", "--port", str(port), "--quiet"]
            service.apis.append(processes.command(f"api-{index}", argv, env))
            service.ports.append(port)
        worker = [sys.executable, str(ROOT / "benchmarks" / "fake_trio_worker.py")]
        for index in range(options.workers):
            argv = [*worker, str(options.latency)]
            service.workers.append(processes.command(f"worker-{index}", argv, env))
        for port, api in zip(service.ports, service.apis, strict=True):
            api.wait_until_serving(f"http://127.0.0.1:{port}/healthz")
        yield service


def connection_ceiling(options: argparse.Namespace) -> int:
    """The most Postgres connections the fleet's pools may open: one engine an API
    process, two a worker (its jobs' and its sweep controller's)."""
    engines = options.apis + WORKER_ENGINES * options.workers
    return engines * (options.db_pool_size + options.db_max_overflow)


def warn_if_pools_overflow(database_url: str, ceiling: int) -> None:
    with psycopg.connect(database_url, autocommit=True) as db:
        limit, reserved, used = db.execute(
            "SELECT current_setting('max_connections')::int, "
            "current_setting('superuser_reserved_connections')::int, "
            "(SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend')"
        ).fetchone()
    free = limit - reserved - used
    if ceiling > free:
        progress(
            f"warning: the pools may open {ceiling} Postgres connections and {free} are free "
            f"(max_connections {limit}); lower --db-pool-size or --db-max-overflow"
        )


def team_keys(service: Fleet, teams: int) -> dict[str, str]:
    admin = opd(service.env, "keys", "create", "--team", "ops", "--scope", "admin")
    keys = {}
    for index in range(teams):
        team = f"team-{index:02d}"
        response = httpx.post(
            f"{service.url(0)}/v1/keys",
            json={"team": team},
            headers={"Authorization": f"Bearer {admin}"},
            timeout=30,
        )
        if not response.is_success:
            raise BenchmarkError(f"POST /v1/keys: {response.status_code} {response.text}")
        keys[team] = response.json()["key"]
    return keys


# --- watching the database and the processes --------------------------------------------------


def backend_cpu(pid: int) -> float | None:
    """A Postgres backend's CPU seconds so far (it may have ended)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Watch:
    """What a thread samples every second until stopped."""

    shares: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    fair: list[float] = field(default_factory=list)
    backend_first: dict[int, float] = field(default_factory=dict)
    backend_last: dict[int, float] = field(default_factory=dict)
    commits: list[tuple[float, int]] = field(default_factory=list)
    ended: int = 0
    peak_connections: int = 0
    rss: dict[str, int] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)

    def sample(self, db: psycopg.Connection, teams: list[str], service: Fleet) -> None:
        rows = db.execute(
            "SELECT t.name, j.status, count(*) FROM jobs j JOIN teams t ON t.id = j.team_id "
            "GROUP BY t.name, j.status"
        ).fetchall()
        counts: dict[str, Counter[str]] = defaultdict(Counter)
        for team, status, count in rows:
            counts[team][status] = count
        self.ended = sum(c["succeeded"] + c["failed"] + c["cancelled"] for c in counts.values())
        running = {team: counts[team]["running"] for team in teams}
        if all(counts[team]["queued"] for team in teams) and sum(running.values()):
            total = sum(running.values())
            self.fair.append(1 / len(teams))
            for team in teams:
                self.shares[team].append(running[team] / total)
        name = db.execute("SELECT current_database()").fetchone()[0]
        commits = db.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = %s", (name,)
        ).fetchone()[0]
        self.commits.append((time.monotonic(), commits))
        pids = db.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
            (name,),
        ).fetchall()
        self.peak_connections = max(self.peak_connections, len(pids))
        for (pid,) in pids:
            seconds = backend_cpu(pid)
            if seconds is not None:
                self.backend_first.setdefault(pid, seconds)
                self.backend_last[pid] = seconds
        for command in [*service.apis, *service.workers]:
            try:
                rss = psutil.Process(command.process.pid).memory_info().rss
            except psutil.Error:
                continue
            self.rss[command.name] = max(self.rss.get(command.name, 0), rss)

    def run(self, database_url: str, teams: list[str], service: Fleet) -> None:
        # pg_stat_database is read in a transaction of its own each time (autocommit), so
        # its counters move; a snapshot within one transaction would not.
        with psycopg.connect(database_url, autocommit=True) as db:
            while not self.stop.is_set():
                self.sample(db, teams, service)
                self.stop.wait(SAMPLE_SECONDS)

    def postgres(self) -> dict[str, float | None]:
        (start, first), (end, last) = self.commits[0], self.commits[-1]
        seconds = max(end - start, 1e-9)
        cpu = sum(self.backend_last[pid] - self.backend_first[pid] for pid in self.backend_last)
        return {
            "commits_per_second": (last - first) / seconds,
            "cpu_percent": 100 * cpu / seconds,
            "backends": len(self.backend_last),
            "peak_connections": self.peak_connections,
            "seconds": seconds,
        }

    def fairness(self) -> dict[str, Any]:
        """Each team's mean share of the running slots, over its fair share."""
        if not self.fair:
            return {"samples": 0, "ratio_min": None, "ratio_max": None, "teams": {}}
        fair = sum(self.fair) / len(self.fair)
        ratios = {team: sum(s) / len(s) / fair for team, s in self.shares.items()}
        return {
            "samples": len(self.fair),
            "fair_share": fair,
            "ratio_min": min(ratios.values()),
            "ratio_max": max(ratios.values()),
            "teams": ratios,
        }


# --- the dashboards ----------------------------------------------------------------------------


@dataclass
class Dashboard:
    """One browser tab: a team's key, an API process, and the running job it shows."""

    key: str
    ports: list[int]
    api: int
    path: str = ""

    @property
    def port(self) -> int:
        return self.ports[self.api % len(self.ports)]

    @property
    def request(self) -> bytes:
        return (
            f"GET {self.path} HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\n"
            f"Authorization: Bearer {self.key}\r\n\r\n"
        ).encode()


@dataclass
class Reads:
    latencies: list[float] = field(default_factory=list)
    answers: list[float] = field(default_factory=list)  # from the send, not the schedule
    errors: int = 0
    moved: int = 0


async def running_jobs(
    database_url: str, running: dict[str, list[int]], done: asyncio.Event
) -> None:
    """Every second: the running jobs of each team; `done` once no job is queued or running."""
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as db:
        while True:
            rows = await (
                await db.execute(
                    "SELECT t.name, j.id, j.status FROM jobs j JOIN teams t ON t.id = j.team_id "
                    "WHERE j.status IN ('queued', 'running', 'cancelling', 'pausing')"
                )
            ).fetchall()
            fresh: dict[str, list[int]] = defaultdict(list)
            for team, job_id, status in rows:
                if status == "running":
                    fresh[team].append(job_id)
            running.clear()
            running.update(fresh)
            if not rows:
                done.set()
                return
            await asyncio.sleep(SAMPLE_SECONDS)


async def poll(
    team: str,
    pair: tuple[Dashboard, Dashboard],
    running: dict[str, list[int]],
    reads: Reads,
    done: asyncio.Event,
    period: float,
    phase: float,
) -> None:
    connections = [HttpConnection(board) for board in pair]
    chance = random.Random(phase)
    moment = time.perf_counter() + phase
    while not done.is_set():
        await sleep_until(moment)
        jobs = running.get(team)
        if jobs:
            job_id = chance.choice(jobs)
            pair[0].path = f"/v1/jobs/{job_id}"
            pair[1].path = f"/v1/jobs/{job_id}/metrics?{CHART}"
            sent = time.perf_counter()
            answers = await asyncio.gather(*(c.fetch() for c in connections))
            reads.latencies.append(time.perf_counter() - moment)
            reads.answers.append(time.perf_counter() - sent)
            if not all(answers):
                reads.errors += 1
                if any(c.streams is None for c in connections):  # the API process is gone
                    reads.moved += 1
                    for board in pair:
                        board.api += 1
        moment += period
    for connection in connections:
        connection.close()


def dashboards(
    database_url: str, keys: dict[str, str], ports: list[int], count: int, period: float
) -> dict[str, Any]:
    """Run `count` dashboards until no job is left to run (in a process of its own)."""

    async def main() -> Reads:
        running: dict[str, list[int]] = {}
        done = asyncio.Event()
        reads = Reads()
        teams = sorted(keys)
        chance = random.Random(0)
        boards = []
        for index in range(count):
            team = teams[index % len(teams)]
            pair = (Dashboard(keys[team], ports, index), Dashboard(keys[team], ports, index))
            phase = chance.uniform(0, period)
            boards.append(poll(team, pair, running, reads, done, period, phase))
        await asyncio.gather(running_jobs(database_url, running, done), *boards)
        return reads

    reads = asyncio.run(main())
    return {
        "reads": len(reads.latencies),
        "errors": reads.errors,
        "moved": reads.moved,
        **latency_summary(reads.latencies),
        "answer": latency_summary(reads.answers),
    }


# --- submitting ---------------------------------------------------------------------------------


async def submit(
    service: Fleet, keys: dict[str, str], options: argparse.Namespace
) -> tuple[RequestStats, float]:
    """Every team posts its share of the jobs at once, 4 requests at a time, spread over
    the API processes."""
    stats = RequestStats()
    run = os.urandom(4).hex()
    per_team = [
        options.jobs // options.teams + (i < options.jobs % options.teams)
        for i in range(options.teams)
    ]

    async def team_client(index: int, team: str, key: str) -> None:
        work = list(range(per_team[index]))
        async with httpx.AsyncClient(
            base_url=service.url(index), headers={"Authorization": f"Bearer {key}"}
        ) as http:

            async def post(job: int) -> None:
                spec = job_spec(team, job, options.steps)
                headers = {"Idempotency-Key": f"{run}-{team}-{job}"}
                response = await send(
                    stats,
                    lambda timeout: http.post(
                        "/v1/jobs", json=spec, headers=headers, timeout=timeout
                    ),
                )
                if response is not None and response.status_code not in (200, 201):
                    stats.rejected[f"{response.status_code} {response.text[:200]}"] += 1

            for start in range(0, len(work), 4):
                await asyncio.gather(*(post(job) for job in work[start : start + 4]))

    started = time.perf_counter()
    await asyncio.gather(
        *(team_client(index, team, keys[team]) for index, team in enumerate(sorted(keys)))
    )
    return stats, time.perf_counter() - started


# --- the run ------------------------------------------------------------------------------------


def kill_when_due(service: Fleet, watch: Watch, jobs: int) -> None:
    """Once a third of the jobs ended, SIGKILL the worker holding the most running jobs
    (its jobs are then taken over) and the last API process."""
    while not watch.stop.is_set():
        if watch.ended >= jobs * KILL_AFTER:
            with psycopg.connect(service.database_url) as db:
                holders = dict(
                    db.execute(
                        "SELECT worker_id, count(*) FROM jobs WHERE status = 'running' "
                        "GROUP BY worker_id"
                    ).fetchall()
                )
            pids = {int(holder.rsplit(":", 1)[1]): n for holder, n in holders.items() if holder}
            worker = max(service.workers, key=lambda w: pids.get(w.process.pid, 0))
            for command in (worker, service.apis[-1]):
                command.process.send_signal(signal.SIGKILL)
                service.killed.append(command.name)
            held = pids.get(worker.process.pid, 0)
            progress(f"killed {', '.join(service.killed)} ({held} running jobs held)")
            return
        watch.stop.wait(0.5)


def outcome(database_url: str, steps: int) -> dict[str, Any]:
    with psycopg.connect(database_url) as db:
        jobs = db.execute(
            "SELECT id, status, attempts, idempotency_key, "
            "extract(epoch FROM started_at - created_at) FROM jobs"
        ).fetchall()
        rows = dict(
            db.execute(
                "SELECT job_id, array_agg(step ORDER BY step) FROM step_metrics GROUP BY job_id"
            ).fetchall()
        )
        starts = db.execute(
            "SELECT extract(epoch FROM min(started_at)), extract(epoch FROM max(started_at)), "
            "extract(epoch FROM min(created_at)) FROM jobs"
        ).fetchone()
    expected = list(range(steps))
    waits = [float(wait) for *_, wait in jobs if wait is not None]
    first_start, last_start, first_created = (float(x) for x in starts)
    return {
        "jobs": len(jobs),
        "statuses": dict(Counter(status for _, status, *_ in jobs)),
        "keys": len({key for *_, key, _ in jobs}),
        "taken_over": sum(attempts > 1 for _, _, attempts, *_ in jobs),
        "wrong_steps": sorted(job_id for job_id, *_ in jobs if rows.get(job_id) != expected),
        "dispatch_per_second": len(waits) / max(last_start - first_start, 1e-9),
        "running_after_s": last_start - first_created,
        "wait_p50_s": percentile(waits, 0.5),
        "wait_p99_s": percentile(waits, 0.99),
    }


def processes_cpu(service: Fleet) -> dict[str, float]:
    """CPU seconds of the API processes and of the workers (the live ones)."""
    totals: dict[str, float] = defaultdict(float)
    for kind, commands in (("apis", service.apis), ("workers", service.workers)):
        for command in commands:
            try:
                times = psutil.Process(command.process.pid).cpu_times()
            except psutil.Error:
                continue
            totals[kind] += times.user + times.system
    return dict(totals)


def benchmark(options: argparse.Namespace) -> dict[str, Any]:
    progress(f"starting {options.apis} API processes and {options.workers} workers")
    with fleet(options) as service:
        keys = team_keys(service, options.teams)
        watch = Watch()
        threads = [
            threading.Thread(target=watch.run, args=(service.database_url, sorted(keys), service)),
            threading.Thread(target=kill_when_due, args=(service, watch, options.jobs)),
        ]
        for thread in threads[: 1 + options.kill]:
            thread.start()
        cpu_before = processes_cpu(service)
        started = time.monotonic()
        try:
            progress(f"{options.teams} teams submit {options.jobs} jobs")
            stats, submit_seconds = asyncio.run(submit(service, keys, options))
            progress(f"submitted in {submit_seconds:.1f} s; {options.dashboards} dashboards poll")
            board = service.processes.call(
                "dashboards",
                dashboards,
                service.database_url,
                keys,
                service.ports,
                options.dashboards,
                options.poll_seconds,
            )
            readers = board.result()
        finally:
            watch.stop.set()
            for thread in threads:
                if thread.is_alive():
                    thread.join()
        seconds = time.monotonic() - started
        cpu_after = processes_cpu(service)
        ended = outcome(service.database_url, options.steps)
        rss = watch.rss
        result = {
            "options": {k: v for k, v in vars(options).items() if k != "json"},
            "seconds": seconds,
            "submit": {
                "seconds": submit_seconds,
                "accepted": sum(n for code, n in stats.answers.items() if code in (200, 201)),
                "server_errors": sum(stats.server_errors.values()),
                "transport_errors": sum(stats.transport_errors.values()),
                "rejected": dict(stats.rejected),
                **latency_summary(stats.latencies),
            },
            "jobs": ended,
            "fairness": watch.fairness(),
            "postgres": watch.postgres(),
            "connection_ceiling": connection_ceiling(options),
            "dashboards": readers,
            "killed": service.killed,
            "rss_mib": {
                "api_max": max(v for k, v in rss.items() if k.startswith("api")) / 2**20,
                "worker_max": max(v for k, v in rss.items() if k.startswith("worker")) / 2**20,
                "worker_mean": sum(v for k, v in rss.items() if k.startswith("worker"))
                / max(1, sum(k.startswith("worker") for k in rss))
                / 2**20,
            },
            "cpu_percent": {
                kind: 100 * (cpu_after.get(kind, 0) - cpu_before.get(kind, 0)) / seconds
                for kind in ("apis", "workers")
            },
            "load_average": os.getloadavg()[0],
        }
        result["lost"] = lost(result, options)
        if result["lost"]:
            raise BenchmarkError(f"jobs lost: {result['lost']}\n{json.dumps(result, indent=2)}")
        return result


def lost(result: dict[str, Any], options: argparse.Namespace) -> list[str]:
    """What the run lost or doubled, in words (empty: nothing)."""
    jobs = result["jobs"]
    problems = []
    if jobs["jobs"] != options.jobs or jobs["keys"] != options.jobs:
        problems.append(f"{jobs['jobs']} job rows, {jobs['keys']} keys for {options.jobs} jobs")
    if jobs["statuses"].get("succeeded", 0) != options.jobs:
        problems.append(f"not every job succeeded: {jobs['statuses']}")
    if jobs["wrong_steps"]:
        problems.append(f"jobs without exactly their steps: {jobs['wrong_steps'][:20]}")
    return problems


def report(result: dict[str, Any]) -> str:
    o, jobs, fair = result["options"], result["jobs"], result["fairness"]
    pg, boards, submit_ = result["postgres"], result["dashboards"], result["submit"]
    lines = [
        f"Fleet: {o['apis']} API processes, {o['workers']} workers x {o['concurrency']} slots, "
        f"{o['jobs']} jobs ({o['steps']} steps, {o['latency']} s a remote request) from "
        f"{o['teams']} teams, {o['dashboards']} dashboards; {result['seconds']:.0f} s, "
        f"load average {result['load_average']:.1f}",
        f"submitted in {submit_['seconds']:.1f} s: POST p50 {cell(submit_['p50_ms'])} ms, "
        f"p99 {cell(submit_['p99_ms'])} ms; 5xx {submit_['server_errors']}, transport errors "
        f"{submit_['transport_errors']}",
        f"dispatched: {jobs['dispatch_per_second']:.1f} jobs/s; created to running p50 "
        f"{jobs['wait_p50_s']:.1f} s, p99 {jobs['wait_p99_s']:.1f} s",
        f"fair share ({fair['samples']} samples with every team waiting): team share / fair "
        f"share {cell(fair['ratio_min'])}..{cell(fair['ratio_max'])}"
        if fair["samples"]
        else "fair share: no sample had every team waiting",
        f"Postgres: {pg['commits_per_second']:.0f} commits/s, backends' CPU "
        f"{pg['cpu_percent']:.0f}% of a core; {pg['peak_connections']} connections at most "
        f"({pg['backends']} backends in all; the pools allow {result['connection_ceiling']})",
        f"dashboards: {boards['reads']} reads, p50 {cell(boards['p50_ms'])} ms, p99 "
        f"{cell(boards['p99_ms'])} ms; errors {boards['errors']} (moved to another API "
        f"{boards['moved']})",
        f"processes: API RSS max {result['rss_mib']['api_max']:.0f} MiB, worker RSS max "
        f"{result['rss_mib']['worker_max']:.0f} MiB; CPU: APIs "
        f"{result['cpu_percent']['apis']:.0f}%, workers {result['cpu_percent']['workers']:.0f}% "
        "of a core",
        f"killed: {', '.join(result['killed']) or 'none'}; jobs taken over {jobs['taken_over']}",
        f"nothing lost: {jobs['statuses']}, each job with exactly its {o['steps']} steps",
    ]
    return "\n".join(lines)


def parse_options(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    count = positive(int)
    parser.add_argument("--apis", type=count, default=4, help="API processes (4)")
    parser.add_argument("--workers", type=count, default=16, help="worker processes (16)")
    parser.add_argument("--concurrency", type=count, default=4, help="jobs per worker (4)")
    parser.add_argument("--jobs", type=count, default=1000, help="jobs (1000)")
    parser.add_argument("--teams", type=count, default=20, help="teams, each with its share (20)")
    parser.add_argument("--steps", type=count, default=3, help="steps a job runs (3)")
    parser.add_argument(
        "--latency", type=positive(float), default=0.5, help="seconds a remote request takes (0.5)"
    )
    parser.add_argument("--dashboards", type=count, default=100, help="dashboards (100)")
    parser.add_argument(
        "--db-pool-size", type=count, default=2, help="each process's Postgres pool (2)"
    )
    parser.add_argument(
        "--db-max-overflow",
        type=int,
        default=2,
        help="connections a process may open beyond its pool (2)",
    )
    parser.add_argument(
        "--poll-seconds", type=positive(float), default=2.0, help="a dashboard's period (2)"
    )
    parser.add_argument(
        "--no-kill", dest="kill", action="store_false", help="kill no worker or API process"
    )
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/12")
    parser.add_argument("--json", type=Path, help="also write every figure as JSON")
    options = parser.parse_args(argv)
    if options.db_max_overflow < 0:
        parser.error("--db-max-overflow must be 0 or more")
    if options.kill and (options.workers < 2 or options.apis < 2):
        parser.error("killing a worker and an API process needs at least 2 of each (or --no-kill)")
    return options


if __name__ == "__main__":
    sys.exit(run_benchmark(benchmark, report, parse_options()))
