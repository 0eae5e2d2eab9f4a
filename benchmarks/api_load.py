"""How fast `GET /v1/jobs/{id}` answers while a job streams metrics, next to a plain
synchronous FastAPI + SQLModel + SQLite endpoint measured in the same run.

    python benchmarks/api_load.py [--database sqlite|postgres] [--duration 20] [--json out.json]

The API (`opd api`), the baseline (one uvicorn process serving `baseline_app`), a step
writer and the load generator are separate processes; see benchmarks/README.md for what is
measured and why it is measured this way.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import random
import sys
import tempfile
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from multiprocessing.synchronize import Event as StopEvent
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import uvloop
import yaml
from fastapi import FastAPI, HTTPException
from harness import (
    FORK,
    HttpConnection,
    Processes,
    Window,
    cell,
    latency_summary,
    milliseconds,
    positive,
    postgres_database,
    progress,
    redis_queue,
    run_benchmark,
    run_clients,
    sleep_until,
)
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlmodel import Session, create_engine
from support import free_port, percentile

from app.auth.keys import create_key
from app.core.config import Settings
from app.core.db import create_db_engine, migrate, session_factory, standalone_session
from app.jobs.schemas import JobPublic
from app.jobs.store import claim_job, create_job
from app.jobs.tables import Job
from app.records.store import record_step
from kernel.spec import JobSpec
from kernel.spec.base import MAX_STEPS
from worker.engine.loop.metrics import step_metrics
from worker.engine.rollouts.sampling import Batch, Completion

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/13"
TINY_SPEC = ROOT / "examples" / "tiny.yaml"
WRITER_ID = "benchmark-writer"
TARGET_P99_MS = 50.0
BEHIND_LATE_MS = 10.0  # the generator's own send delay beyond which its figures are suspect
BEHIND_CPU_PCT = 90.0  # ... or its share of one core


# --- figures ----------------------------------------------------------------------------------


# --- load generation: raw HTTP/1.1 keep-alive on uvloop, in a process of its own --------------


@dataclass(frozen=True)
class Target:
    """One server's job endpoint, as the load generator asks for it."""

    name: str
    port: int
    job_id: int
    key: str

    @property
    def request(self) -> bytes:
        return (
            f"GET /v1/jobs/{self.job_id} HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\n"
            f"Authorization: Bearer {self.key}\r\n\r\n"
        ).encode()


@dataclass(frozen=True)
class Load:
    dashboards: int
    poll_hz: float
    clients: int
    warmup: float
    duration: float


@dataclass
class Tally:
    latencies: list[float] = field(default_factory=list)
    late_sends: list[float] = field(default_factory=list)
    errors: int = 0
    answered_in_window: int = 0  # 200s that arrived inside the window, whenever scheduled
    scheduled: int = 0


async def dashboard(
    target: Target, first: float, interval: float, window: Window, tally: Tally
) -> None:
    """Poll on a fixed schedule. Latency counts from the scheduled send time, so a slow
    answer that delays the next poll shows as queueing (no coordinated omission)."""
    connection = HttpConnection(target)
    due_times = [first + k * interval for k in range(math.ceil((window.end - first) / interval))]
    tally.scheduled += sum(due >= window.start for due in due_times)
    free_since = time.perf_counter()
    try:
        for due in due_times:
            await sleep_until(due)
            late = time.perf_counter() - max(due, free_since)
            ok = await connection.fetch()
            done = free_since = time.perf_counter()
            if ok and window.start <= done < window.end:
                tally.answered_in_window += 1
            if due < window.start:
                continue
            tally.late_sends.append(late)
            if ok:
                tally.latencies.append(done - due)
            else:
                tally.errors += 1
    finally:
        connection.close()


async def closed_client(target: Target, window: Window, tally: Tally) -> None:
    """Send the next request as soon as the previous one is answered."""
    connection = HttpConnection(target)
    try:
        while (sent := time.perf_counter()) < window.end:
            ok = await connection.fetch()
            done = time.perf_counter()
            if not window.start <= done < window.end:
                continue
            if ok:
                tally.answered_in_window += 1
                tally.latencies.append(done - sent)
            else:
                tally.errors += 1
    finally:
        connection.close()


def new_window(load: Load) -> Window:
    start = time.perf_counter() + load.warmup
    return Window(start, start + load.duration)


async def open_loop(target: Target, load: Load) -> dict[str, Any]:
    """`dashboards` pollers at `poll_hz` each, at random (seeded, so repeatable) phases."""
    window = new_window(load)
    interval = 1 / load.poll_hz
    phases = random.Random(0)
    begin = window.start - load.warmup
    tally = Tally()
    clients = [
        dashboard(target, begin + phases.random() * interval, interval, window, tally)
        for _ in range(load.dashboards)
    ]
    cpu, _ = await run_clients(clients, window)
    return {
        "offered_rps": load.dashboards * load.poll_hz,
        "achieved_rps": tally.answered_in_window / load.duration,
        **latency_summary(tally.latencies),
        "requests": len(tally.latencies),
        "errors": tally.errors,
        "unfinished": tally.scheduled - len(tally.latencies) - tally.errors,
        "generator_cpu_pct": cpu,
        "generator_late_p99_ms": milliseconds(percentile(sorted(tally.late_sends), 0.99)),
    }


async def closed_loop(target: Target, load: Load) -> dict[str, Any]:
    window = new_window(load)
    tally = Tally()
    cpu, unfinished = await run_clients(
        [closed_client(target, window, tally) for _ in range(load.clients)], window
    )
    return {
        "clients": load.clients,
        "rps": tally.answered_in_window / load.duration,
        **latency_summary(tally.latencies),
        "requests": len(tally.latencies),
        "errors": tally.errors,
        "unfinished": unfinished,
        "generator_cpu_pct": cpu,
    }


async def measure(targets: Sequence[Target], load: Load) -> dict[str, dict[str, Any]]:
    results: dict[str, dict[str, Any]] = {}
    for target in targets:
        results[target.name] = {}
        for phase, run in (("open_loop", open_loop), ("closed_loop", closed_loop)):
            seconds = load.warmup + load.duration
            progress(f"measuring {target.name}: {phase.replace('_', ' ')} ({seconds:g} s)")
            results[target.name][phase] = await run(target, load)
    return results


def generate_load(targets: Sequence[Target], load: Load) -> dict[str, dict[str, Any]]:
    """The load generator process: every phase against every target, one after another."""
    return uvloop.run(measure(targets, load))


# --- the metrics writer: a running job's database writes, in a process of its own -------------


@dataclass(frozen=True)
class Stream:
    """Where the writer records steps: a claimed job in one database."""

    database_url: str
    job_id: int


def sample_metrics(step: int) -> dict[str, float]:
    """One step's metrics under the real names: the loop's own plus the local trainer's."""
    noise = random.Random(step)
    kls = [noise.uniform(0.0, 2.0) for _ in range(16 * 24)]
    trainer = {
        "loss_sum": noise.uniform(-50, 50),
        "loss_mean": noise.uniform(-0.1, 0.1),
        "token_count": len(kls),
        "grad_norm": noise.uniform(0.1, 5.0),
        "learning_rate": 1e-3,
    }
    batch = Batch(
        [
            Completion([], [0] * 24, kls[i * 24 : (i + 1) * 24], [0.0] * 24, "stop")
            for i in range(16)
        ]
    )
    elapsed = noise.uniform(0.5, 1.5)
    one_prompt = [SimpleNamespace(teachers=("teacher",), pool=SimpleNamespace(name="dataset"))]
    return step_metrics(batch, one_prompt, trainer, lr=1e-3, step=step, elapsed=elapsed, phases={})


async def write_step(
    sessions: async_sessionmaker[AsyncSession], job_id: int, step: int, metrics: dict[str, float]
) -> float:
    """Seconds one step's write took, session included, as in the worker's database sink."""
    began = time.perf_counter()
    async with sessions() as session:
        await record_step(session, job_id, WRITER_ID, step, metrics)
    return time.perf_counter() - began


async def stream_steps(
    measured: Stream, mirrors: Sequence[Stream], steps_per_second: float, stop: StopEvent
) -> dict[str, Any]:
    """Record a step every 1/steps_per_second s, timing the writes to `measured`;
    `mirrors` get the same steps."""
    streams = (measured, *mirrors)
    engines = [create_db_engine(stream.database_url) for stream in streams]
    writes = [(session_factory(e), s.job_id) for e, s in zip(engines, streams, strict=True)]
    durations: list[float] = []
    metrics_per_step = len(sample_metrics(0))
    start = time.perf_counter()
    step = 0
    try:
        while not stop.is_set():
            await asyncio.sleep(max(0.0, start + step / steps_per_second - time.perf_counter()))
            metrics = sample_metrics(step)
            seconds = [
                await write_step(sessions, job_id, step, metrics) for sessions, job_id in writes
            ]
            durations.append(seconds[0])
            step += 1
    finally:
        for engine in engines:
            await engine.dispose()
    return {
        "steps": step,
        "steps_per_second": step / (time.perf_counter() - start),
        "metrics_per_step": metrics_per_step,
        **latency_summary(durations),
    }


def write_steps(
    measured: Stream, mirrors: Sequence[Stream], steps_per_second: float, stop: StopEvent
) -> dict[str, Any]:
    """The writer process; it runs `asyncio.run` like `opd worker`."""
    return asyncio.run(stream_steps(measured, mirrors, steps_per_second, stop))


# --- the baseline -----------------------------------------------------------------------------


def baseline_app() -> FastAPI:
    """The obvious synchronous endpoint: a `def` route, a sync SQLModel Session per request,
    SQLite at OPD_DATABASE_URL. Serve with
    `uvicorn --app-dir benchmarks --factory api_load:baseline_app`."""
    engine = create_engine(os.environ["OPD_DATABASE_URL"])
    app = FastAPI()

    @app.get("/v1/jobs/{job_id}", response_model=JobPublic)
    def read_job(job_id: int) -> Job:
        with Session(engine) as session:
            job = session.get(Job, job_id)
            if job is None:
                raise HTTPException(404, f"job {job_id} not found")
            return job

    return app


# --- setting up and tearing down --------------------------------------------------------------


@dataclass(frozen=True)
class Seeded:
    key: str
    job_id: int


async def seed(database_url: str) -> Seeded:
    """A team, its key and a long tiny job, claimed by the writer as a worker would."""
    spec = yaml.safe_load(TINY_SPEC.read_text())
    spec["loop"]["steps"] = MAX_STEPS
    async with standalone_session(database_url) as session:
        new_key = await create_key(session, "benchmark")
        job = (await create_job(session, new_key.team.id, JobSpec.model_validate(spec))).job
        await claim_job(session, job.id, WRITER_ID, heartbeat_timeout=3600)
    return Seeded(new_key.key, job.id)


def prepare(database_url: str) -> Seeded:
    migrate(database_url)
    return asyncio.run(seed(database_url))


# --- the run ----------------------------------------------------------------------------------


def benchmark(args: argparse.Namespace) -> dict[str, Any]:
    load = Load(args.dashboards, args.poll_hz, args.clients, args.warmup, args.duration)
    api_settings = Settings(_env_file=ROOT / ".env")  # as the API (run in ROOT) reads them
    settings = {
        "database": args.database,
        "duration_s": args.duration,
        "warmup_s": args.warmup,
        "dashboards": args.dashboards,
        "poll_hz": args.poll_hz,
        "clients": args.clients,
        "steps_per_second": args.steps_per_second,
        "job_cache_seconds": api_settings.job_cache_seconds,
        "auth_cache_seconds": api_settings.auth_cache_seconds,
        "cpus": os.cpu_count(),
        "load_average_at_start": os.getloadavg()[0],
    }
    with ExitStack() as stack:
        home = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="opd-bench-")))
        if args.database == "postgres":
            database_url = stack.enter_context(postgres_database())
            baseline_url = f"sqlite:///{home / 'baseline.db'}"
        else:
            database_url = baseline_url = f"sqlite:///{home / 'opd.db'}"
        queue = stack.enter_context(redis_queue(args.redis_url))
        processes = Processes(home)
        stack.callback(processes.close)

        progress(f"preparing {args.database} (and the baseline's SQLite)")
        ours = prepare(database_url)
        theirs = ours if baseline_url == database_url else prepare(baseline_url)
        env = os.environ | {
            "OPD_HOME": str(home),
            "OPD_DATABASE_URL": database_url,
            "OPD_REDIS_URL": args.redis_url,
            "OPD_QUEUE_NAME": queue,
        }
        api_port, baseline_port = free_port(), free_port()
        api = processes.command(
            "API", [sys.executable, "-m", "opd.cli", "api", "--port", str(api_port), "--quiet"], env
        )
        baseline = processes.command(
            "baseline",
            [
                sys.executable,
                "-m",
                "uvicorn",
                "--app-dir",
                str(ROOT / "benchmarks"),
                "--factory",
                "api_load:baseline_app",
                "--port",
                str(baseline_port),
                "--log-level",
                "warning",
            ],
            env | {"OPD_DATABASE_URL": baseline_url},
        )
        api.wait_until_serving(f"http://127.0.0.1:{api_port}/readyz")
        baseline.wait_until_serving(f"http://127.0.0.1:{baseline_port}/v1/jobs/{theirs.job_id}")

        stop = FORK.Event()
        mirrors = [] if theirs is ours else [Stream(baseline_url, theirs.job_id)]
        writer = processes.call(
            "step writer",
            write_steps,
            Stream(database_url, ours.job_id),
            mirrors,
            args.steps_per_second,
            stop,
        )
        targets = [
            Target("ours", api_port, ours.job_id, ours.key),
            Target("baseline", baseline_port, theirs.job_id, theirs.key),
        ]
        measured = processes.call("load generator", generate_load, targets, load).result()
        stop.set()
        writes = writer.result()
    return {"settings": settings, **measured, "record_step": writes}


# --- the report -------------------------------------------------------------------------------

ROW = "  {:<34}{:>14}{:>14}{:>16}"
Rows = Sequence[tuple[str, tuple[str, ...], str | None]]  # label, figures, which way is better
OPEN_LOOP_ROWS: Rows = (
    ("p50 latency (ms)", ("p50_ms",), "lower"),
    ("p99 latency (ms)", ("p99_ms",), "lower"),
    ("achieved rate (req/s)", ("achieved_rps",), None),
    ("errors / unfinished", ("errors", "unfinished"), None),
    ("generator cpu % / late p99 (ms)", ("generator_cpu_pct", "generator_late_p99_ms"), None),
)
CLOSED_LOOP_ROWS: Rows = (
    ("throughput (req/s)", ("rps",), "higher"),
    ("p50 / p99 latency (ms)", ("p50_ms", "p99_ms"), None),
    ("errors / unfinished", ("errors", "unfinished"), None),
    ("generator cpu %", ("generator_cpu_pct",), None),
)


def factor(ours: float | None, baseline: float | None, better: str | None) -> str:
    """How many times better ours is than the baseline."""
    if better is None or not ours or not baseline:
        return ""
    return f"{baseline / ours if better == 'lower' else ours / baseline:.1f}x"


def table(ours: dict[str, Any], baseline: dict[str, Any], rows: Rows) -> list[str]:
    lines = []
    for label, figures, better in rows:
        cells = [" / ".join(cell(phase[name]) for name in figures) for phase in (ours, baseline)]
        lines.append(
            ROW.format(label, *cells, factor(ours[figures[0]], baseline[figures[0]], better))
        )
    return lines


def generator_notes(result: dict[str, Any]) -> list[str]:
    """Phases where the load generator could not keep to its schedule or ran out of CPU."""
    notes = []
    for name in ("ours", "baseline"):
        for phase, figures in result[name].items():
            cpu, late = figures["generator_cpu_pct"], figures.get("generator_late_p99_ms") or 0.0
            if cpu > BEHIND_CPU_PCT or late > BEHIND_LATE_MS:
                notes.append(
                    f"note: the load generator fell behind ({name}, {phase.replace('_', ' ')}: "
                    f"{cpu:.0f}% of a core, sends {late:.1f} ms late at p99); "
                    "its delay is part of those figures"
                )
    return notes


def report(result: dict[str, Any]) -> str:
    s, writes = result["settings"], result["record_step"]
    ours, baseline = result["ours"], result["baseline"]
    open_loop = ours["open_loop"]
    target_met = (
        open_loop["p99_ms"] is not None
        and open_loop["p99_ms"] < TARGET_P99_MS
        and open_loop["errors"] == open_loop["unfinished"] == 0
    )
    return "\n".join(
        [
            f"GET /v1/jobs/{{id}} on {s['database']}: {s['duration_s']:g} s per phase after "
            f"{s['warmup_s']:g} s warm-up; {s['cpus']} CPUs, load {s['load_average_at_start']:.1f} "
            "at start",
            f"job cache {s['job_cache_seconds']:g} s, auth cache {s['auth_cache_seconds']:g} s; "
            f"a writer records {s['steps_per_second']:g} steps/s throughout",
            "",
            ROW.format("", "ours", "baseline", "ours better by"),
            f"open loop: {s['dashboards']} dashboards x {s['poll_hz']:g}/s "
            f"({open_loop['offered_rps']:g} req/s offered)",
            *table(open_loop, baseline["open_loop"], OPEN_LOOP_ROWS),
            f"closed loop: {s['clients']} clients",
            *table(ours["closed_loop"], baseline["closed_loop"], CLOSED_LOOP_ROWS),
            f"record_step on {s['database']} ({writes['metrics_per_step']} metrics; "
            f"{writes['steps']} steps at {writes['steps_per_second']:.1f}/s): "
            f"p50 {cell(writes['p50_ms'])} ms, p99 {cell(writes['p99_ms'])} ms, "
            f"max {cell(writes['max_ms'])} ms",
            "",
            f"target p99 < {TARGET_P99_MS:g} ms at {open_loop['offered_rps']:g} req/s: "
            f"{'met' if target_met else 'NOT met'} ({cell(open_loop['p99_ms'])} ms)",
            *generator_notes(result),
        ]
    )


# --- the command line -------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    cli = argparse.ArgumentParser(
        description="Latency and throughput of GET /v1/jobs/{id} while a job streams metrics, "
        "next to a plain synchronous FastAPI + SQLModel + SQLite endpoint."
    )
    cli.add_argument("--database", choices=("sqlite", "postgres"), default="sqlite")
    cli.add_argument(
        "--duration",
        type=positive(float),
        default=20.0,
        help="seconds measured in each of the four phases (default 20)",
    )
    cli.add_argument(
        "--warmup",
        type=positive(float),
        default=2.0,
        help="seconds of load before each phase is measured (default 2)",
    )
    cli.add_argument(
        "--dashboards",
        type=positive(int),
        default=200,
        help="open loop: simulated dashboards (default 200)",
    )
    cli.add_argument(
        "--poll-hz",
        type=positive(float),
        default=2.0,
        help="open loop: polls per second per dashboard (default 2)",
    )
    cli.add_argument(
        "--clients",
        type=positive(int),
        default=50,
        help="closed loop: concurrent clients (default 50)",
    )
    cli.add_argument(
        "--steps-per-second",
        type=positive(float),
        default=10.0,
        help="steps the writer records per second (default 10)",
    )
    cli.add_argument(
        "--redis-url",
        default=DEFAULT_REDIS_URL,
        help=f"Redis for the API's queue (default {DEFAULT_REDIS_URL})",
    )
    cli.add_argument("--json", type=Path, metavar="PATH", help="also write the figures here")
    return cli


def main(argv: Sequence[str] | None = None) -> int:
    return run_benchmark(benchmark, report, parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
