"""Chart reads that dashboards poll: dashboard load on jobs of 200, 1,000 and 20,000 steps,
a 100,000-step job's 1,000-point curve and full export, record_step before and after the
metric store, a requeuing pass over 1,000 waiting jobs, and (with --compare-mlflow) MLflow's
get-history-bulk-interval on the same data, side by side in one run.

    python benchmarks/curve_reads.py [--databases sqlite,postgres] [--duration 20]
                                     [--compare-mlflow] [--json out.json]

See benchmarks/README.md for what is measured and how.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import random
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from multiprocessing.synchronize import Event as StopEvent
from pathlib import Path
from typing import Any

import httpx
import uvloop
import yaml
from harness import (
    FORK,
    BenchmarkError,
    HttpConnection,
    Processes,
    Window,
    cell,
    latency_summary,
    positive,
    postgres_database,
    progress,
    redis_queue,
    run_benchmark,
    run_clients,
    sleep_until,
)
from seeding import METRIC_NAMES, TINY_SPEC, fill, metrics_at
from sqlalchemy import text, update
from sqlalchemy.ext.asyncio import AsyncSession
from support import free_port

from app.auth.keys import create_key
from app.core.config import Settings
from app.core.db import create_db_engine, migrate, session_factory
from app.core.queue import JobQueue
from app.core.tables import finite_or_none, utcnow
from app.curves.block_store import keep_summaries, step_probe
from app.jobs.rows import held
from app.jobs.schemas import JobStatus
from app.jobs.store import claim_job, create_job
from app.jobs.tables import Job
from app.records.store import record_step, upsert_metrics
from kernel.spec import JobSpec
from kernel.spec.base import MAX_STEPS
from worker.service.requeuer import requeue_lost
from worker.service.sight import DatabaseSight, blind_after

ROOT = Path(__file__).resolve().parents[1]
WRITER_ID = "benchmark-writer"
SIZES = (200, 1_000, 20_000)  # the dashboard load's jobs
LONG_STEPS = 100_000  # the job whose curve and export are timed
CHART = "keys=opd/reverse_kl_mean,trainer/loss_mean&max_points=500"
CURVE_KEY = "opd/reverse_kl_mean"
CURVE_POINTS = 1000
WAITING_JOBS = 1_000  # queued jobs a requeuing pass looks at
STARTUP_SECONDS = 60.0
TARGET_LOAD_P99_MS = 100.0
TARGET_CURVE_MS = 20.0
TARGET_MLFLOW_RATIO = 5.0
TARGET_EXPORT_S = 2.0
TARGET_WRITE_RATIO = 2.0
# --- one deployment per database --------------------------------------------------------------


@dataclass
class Deployment:
    """A database with jobs of every size, and the `opd api` serving it."""

    name: str
    url: str
    key: str = ""
    jobs: dict[int, int] = field(default_factory=dict)  # steps -> job id (running)
    long_job: int = 0  # the long job's id: finished
    port: int = 0


async def new_job(session: AsyncSession, team_id: int) -> int:
    spec = yaml.safe_load(TINY_SPEC.read_text())
    spec["loop"]["steps"] = MAX_STEPS
    job = (await create_job(session, team_id, JobSpec.model_validate(spec))).job
    await claim_job(session, job.id, WRITER_ID, heartbeat_timeout=3600)
    return job.id


async def seed(deployment: Deployment, sizes: Sequence[int], long_steps: int) -> None:
    """A key, a running job of each size and a finished long job, as if recorded."""
    async with session_factory(engine := create_db_engine(deployment.url))() as session:
        new_key = await create_key(session, "benchmark")
        deployment.key = new_key.key
        for steps in sizes:
            deployment.jobs[steps] = await new_job(session, new_key.team.id)
            await fill(session, deployment.jobs[steps], steps)
        deployment.long_job = await new_job(session, new_key.team.id)
        await fill(session, deployment.long_job, long_steps)
        finished = update(Job).where(Job.id == deployment.long_job)
        await session.execute(finished.values(status=JobStatus.succeeded))
        if session.bind.dialect.name == "postgresql":
            await session.execute(text("ANALYZE"))  # as autovacuum would have by now
        await session.commit()
    await engine.dispose()


# --- the dashboard load -----------------------------------------------------------------------


@dataclass(frozen=True)
class Poll:
    """One GET as the load generator sends it (what HttpConnection needs)."""

    port: int
    path: str
    key: str

    @property
    def request(self) -> bytes:
        return (
            f"GET {self.path} HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\n"
            f"Authorization: Bearer {self.key}\r\n\r\n"
        ).encode()


@dataclass
class Tally:
    job: list[float] = field(default_factory=list)
    chart: list[float] = field(default_factory=list)
    errors: int = 0
    scheduled: int = 0


async def timed(connection: HttpConnection, due: float) -> float | None:
    """Seconds from the scheduled time to the whole answer; None for an error."""
    ok = await connection.fetch()
    return time.perf_counter() - due if ok else None


async def dashboard(
    polls: tuple[Poll, Poll], first: float, interval: float, window: Window, tally: Tally
) -> None:
    """Every `interval` s, the job and its chart at once (two connections, as a browser);
    latency counts from the scheduled time, so a slow answer delaying the next poll shows."""
    job, chart = HttpConnection(polls[0]), HttpConnection(polls[1])  # type: ignore[arg-type]
    due_times = [first + k * interval for k in range(math.ceil((window.end - first) / interval))]
    tally.scheduled += 2 * sum(due >= window.start for due in due_times)
    try:
        for due in due_times:
            await sleep_until(due)
            answers = await asyncio.gather(timed(job, due), timed(chart, due))
            if due < window.start:
                continue
            for seconds, kept in zip(answers, (tally.job, tally.chart), strict=True):
                if seconds is None:
                    tally.errors += 1
                else:
                    kept.append(seconds)
    finally:
        job.close()
        chart.close()


async def load(
    polls: tuple[Poll, Poll], dashboards: int, warmup: float, duration: float
) -> dict[str, Any]:
    start = time.perf_counter() + warmup
    window = Window(start, start + duration)
    interval = 2.0
    phases = random.Random(0)
    tally = Tally()
    clients = [
        dashboard(
            polls, window.start - warmup + phases.random() * interval, interval, window, tally
        )
        for _ in range(dashboards)
    ]
    cpu, _ = await run_clients(clients, window)
    answered = tally.job + tally.chart
    return {
        "requests": len(answered),
        "errors": tally.errors,
        "unfinished": tally.scheduled - len(answered) - tally.errors,
        **latency_summary(answered),
        "chart": latency_summary(tally.chart),
        "job": latency_summary(tally.job),
        "generator_cpu_pct": cpu,
    }


def generate_load(
    polls: tuple[Poll, Poll], dashboards: int, warmup: float, duration: float
) -> dict[str, Any]:
    return uvloop.run(load(polls, dashboards, warmup, duration))


async def append_steps(
    url: str, job_id: int, first: int, per_second: float, stop: StopEvent
) -> int:
    """The running job: record a step every 1/per_second s through record_step."""
    engine = create_db_engine(url)
    sessions = session_factory(engine)
    step, start = first, time.perf_counter()
    try:
        while not stop.is_set():
            await asyncio.sleep(max(0.0, start + (step - first) / per_second - time.perf_counter()))
            async with sessions() as session:
                await record_step(session, job_id, WRITER_ID, step, metrics_at(step))
            step += 1
    finally:
        await engine.dispose()
    return step - first


def write_steps(url: str, job_id: int, first: int, per_second: float, stop: StopEvent) -> int:
    return asyncio.run(append_steps(url, job_id, first, per_second, stop))


def dashboard_load(processes: Processes, d: Deployment, args: argparse.Namespace) -> dict[str, Any]:
    results = {}
    for steps, job_id in d.jobs.items():
        progress(f"{d.name}: {args.dashboards} dashboards on the {steps:,}-step job")
        polls = (
            Poll(d.port, f"/v1/jobs/{job_id}", d.key),
            Poll(d.port, f"/v1/jobs/{job_id}/metrics?{CHART}", d.key),
        )
        stop = FORK.Event()
        writer = processes.call(
            "step writer", write_steps, d.url, job_id, steps, args.steps_per_second, stop
        )
        figures = processes.call(
            "load generator", generate_load, polls, args.dashboards, args.warmup, args.duration
        ).result()
        stop.set()
        figures["steps_written"] = writer.result()
        results[str(steps)] = figures
    return results


# --- sequential timings over loopback ---------------------------------------------------------


def timings(
    client: httpx.Client, urls: Sequence[str], headers: dict[str, str] | None = None
) -> dict[str, Any]:
    """p50/p99 of sequential GETs of `urls` after the first (a warm-up), and the last
    answer's size."""
    seconds, size = [], 0
    for url in urls:
        began = time.perf_counter()
        response = client.get(url, headers=headers)
        seconds.append(time.perf_counter() - began)
        if response.status_code not in (200, 304):
            raise BenchmarkError(f"GET {url} answered {response.status_code}: {response.text}")
        size = len(response.content)
    return {**latency_summary(seconds[1:]), "bytes": size}


def export_time(client: httpx.Client, url: str) -> dict[str, Any]:
    began = time.perf_counter()
    size = lines = 0
    with client.stream("GET", url) as response:
        response.raise_for_status()
        for chunk in response.iter_bytes():
            size += len(chunk)
            lines += chunk.count(b"\n")
    return {"seconds": time.perf_counter() - began, "bytes": size, "lines": lines}


def long_job_reads(d: Deployment, long_steps: int, repeats: int) -> dict[str, Any]:
    progress(f"{d.name}: the long job's curve and export")
    base = f"http://127.0.0.1:{d.port}/v1/jobs/{d.long_job}"
    auth = {"Authorization": f"Bearer {d.key}"}
    with httpx.Client(headers=auth, timeout=120) as client:
        curve_url = f"{base}/metrics?keys={CURVE_KEY}&max_points={CURVE_POINTS}"
        # Each request ends one step earlier: a query of its own, so each is a read and
        # none is answered from the API's answers kept by ETag.
        ranges = [f"{curve_url}&to_step={long_steps - 1 - i}" for i in range(repeats + 1)]
        curve = timings(client, ranges)
        body = client.get(curve_url).json()
        tag = client.get(curve_url).headers["etag"]
        unchanged = timings(client, [curve_url] * (repeats + 1), {"If-None-Match": tag})
        return {
            "curve": curve | {"points": len(body["curves"][CURVE_KEY]["steps"])},
            "downsampling": body["downsampling"],
            "unchanged_poll": unchanged,
            "export_csv": export_time(client, f"{base}/metrics/export?format=csv"),
            "export_jsonl": export_time(client, f"{base}/metrics/export?format=jsonl"),
        }


# --- record_step before and after, and a requeuing pass ------------------------------------


async def record_step_0001(
    session: AsyncSession, job_id: int, step: int, metrics: dict[str, float]
) -> None:
    """record_step as revision 0001 had it: progress and the step row, nothing else."""
    now = utcnow()
    await session.execute(
        update(Job)
        .where(*held(job_id, WRITER_ID))
        .values(steps_done=step + 1, heartbeat_at=now, updated_at=now)
    )
    clean = {name: finite_or_none(value) for name, value in metrics.items()}
    dialect = (await session.connection()).dialect.name
    await session.execute(upsert_metrics(dialect, job_id, step, clean, now))
    await session.commit()


async def record_step_0002(
    session: AsyncSession, job_id: int, step: int, metrics: dict[str, float]
) -> None:
    """record_step as revision 0002 made it: 0001's, plus the block summaries (what the
    metric store itself costs, apart from what later revisions keep per step)."""
    now = utcnow()
    result = await session.execute(
        update(Job)
        .where(*held(job_id, WRITER_ID))
        .values(steps_done=step + 1, heartbeat_at=now, updated_at=now)
        .returning(*step_probe(job_id, step))
    )
    newest, before = result.one()
    clean = {name: finite_or_none(value) for name, value in metrics.items()}
    dialect = (await session.connection()).dialect.name
    await session.execute(upsert_metrics(dialect, job_id, step, clean, now))
    await keep_summaries(session, job_id, step, newest, changed=before != clean)
    await session.commit()


async def record_step_today(
    session: AsyncSession, job_id: int, step: int, metrics: dict[str, float]
) -> None:
    await record_step(session, job_id, WRITER_ID, step, metrics)


WRITES = {"before": record_step_0001, "store": record_step_0002, "after": record_step_today}


async def write_cost(url: str, steps: int) -> dict[str, Any]:
    """The same steps written to a fresh job per variant, in turn, step by step."""
    engine = create_db_engine(url)
    sessions = session_factory(engine)
    async with sessions() as session:
        team_id = (await create_key(session, "writes")).team.id
        jobs = {name: await new_job(session, team_id) for name in WRITES}
    seconds: dict[str, list[float]] = {name: [] for name in WRITES}
    for step in range(steps):
        metrics = metrics_at(step)
        for name, write in WRITES.items():
            began = time.perf_counter()
            async with sessions() as session:
                await write(session, jobs[name], step, metrics)
            seconds[name].append(time.perf_counter() - began)
    await engine.dispose()
    return {"steps": steps} | {name: latency_summary(kept) for name, kept in seconds.items()}


async def requeue_time(url: str, redis_url: str, queue_name: str, jobs: int) -> dict[str, Any]:
    """One requeuing pass over `jobs` queued jobs whose messages wait in Redis."""
    engine = create_db_engine(url)
    sessions = session_factory(engine)
    queue = JobQueue(redis_url, queue_name)
    spec = JobSpec.model_validate(yaml.safe_load(TINY_SPEC.read_text()))
    async with sessions() as session:
        team_id = (await create_key(session, "requeue")).team.id
        ids = [(await create_job(session, team_id, spec)).job.id for _ in range(jobs)]
        for job_id in ids:
            await queue.push(job_id, 0)
        an_hour_ago = utcnow() - timedelta(hours=1)
        await session.execute(update(Job).where(Job.id.in_(ids)).values(updated_at=an_hour_ago))
        await session.commit()
    settings = Settings(  # the benchmark's running jobs are not orphans
        database_url=url, redis_url=redis_url, queue_name=queue_name, heartbeat_timeout=86_400
    )
    began = time.perf_counter()
    sight = DatabaseSight(blind_after(settings.heartbeat_timeout, settings.requeue_interval))
    sent = await requeue_lost(sessions, queue, settings, sight)
    seconds = time.perf_counter() - began
    await queue.close()
    await engine.dispose()
    return {"jobs": jobs, "ms": seconds * 1000, "sent": len(sent)}


# --- MLflow in a throwaway venv ---------------------------------------------------------------


@contextmanager
def mlflow_server(home: Path, processes: Processes) -> Iterator[tuple[str, Path]]:
    """`pip install mlflow` into a new venv; its tracking server on SQLite, and the file."""
    venv = home / "mlflow-venv"
    progress("installing MLflow into a throwaway venv (a few minutes)")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    log = home / "mlflow-pip.log"
    with log.open("wb") as out:
        installed = subprocess.run(
            [str(venv / "bin" / "pip"), "install", "--quiet", "mlflow"], stdout=out, stderr=out
        )
    if installed.returncode != 0:
        raise BenchmarkError(f"pip install mlflow failed; its log ends:\n{log.read_text()[-3000:]}")
    version = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import mlflow; print(mlflow.__version__)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    port, store = free_port(), home / "mlflow.db"
    server = processes.command(
        "mlflow",
        [
            str(venv / "bin" / "mlflow"),
            "server",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--backend-store-uri",
            f"sqlite:///{store}",
            "--default-artifact-root",
            str(home / "mlflow-artifacts"),
            "--workers",
            "1",
        ],
        os.environ | {"MLFLOW_HOME": str(home)},
    )
    url = f"http://127.0.0.1:{port}"
    server.wait_until_serving(f"{url}/health")
    progress(f"MLflow {version} serving on SQLite")
    yield url, store


def mlflow_reads(url: str, store: Path, steps: int, repeats: int) -> dict[str, Any]:
    """The 100,000-step job's metrics in one MLflow run, then get-history-bulk-interval
    timed for a 1,000-point curve. The last step goes through MLflow's log-batch (so its
    latest-metric rows are MLflow's own); the rest is inserted into its `metrics` table
    directly: log-batch takes about 1.5 s per 1,000 values here, 35 minutes for the job."""
    api = f"{url}/api/2.0/mlflow"
    progress(f"loading {steps:,} steps x {len(METRIC_NAMES)} metrics into MLflow")
    with httpx.Client(timeout=300) as client:
        experiment = client.post(f"{api}/experiments/create", json={"name": "opd"}).json()
        created = client.post(f"{api}/runs/create", json=experiment).json()
        run_id = created["run"]["info"]["run_id"]
        stamp = int(time.time() * 1000)
        last = steps - 1
        batch = [mlflow_metric(key, value, stamp, last) for key, value in metrics_at(last).items()]
        logged = client.post(f"{api}/runs/log-batch", json={"run_id": run_id, "metrics": batch})
        logged.raise_for_status()
        with sqlite3.connect(store) as db:
            db.executemany(
                "INSERT INTO metrics (key, value, timestamp, run_uuid, step, is_nan) "
                "VALUES (?, ?, ?, ?, ?, 0)",
                (
                    (key, value, stamp + step, run_id, step)
                    for step in range(last)
                    for key, value in metrics_at(step).items()
                ),
            )
        query = f"run_ids={run_id}&metric_key={CURVE_KEY}&max_results={CURVE_POINTS}"
        curve_url = f"{url}/ajax-api/2.0/mlflow/metrics/get-history-bulk-interval?{query}"
        curve = timings(client, [curve_url] * (repeats + 1))
        points = len(client.get(curve_url).json()["metrics"])
    return {"curve": curve | {"points": points}}


def mlflow_metric(key: str, value: float, stamp: int, step: int) -> dict[str, Any]:
    return {"key": key, "value": value, "timestamp": stamp + step, "step": step}


# --- the run ----------------------------------------------------------------------------------


@contextmanager
def database(name: str, home: Path) -> Iterator[str]:
    if name == "sqlite":
        yield f"sqlite:///{home / 'opd.db'}"
        return
    with postgres_database() as url:
        yield url


def benchmark(args: argparse.Namespace) -> dict[str, Any]:
    result: dict[str, Any] = {
        "settings": {
            "databases": args.databases,
            "dashboards": args.dashboards,
            "duration_s": args.duration,
            "warmup_s": args.warmup,
            "steps_per_second": args.steps_per_second,
            "repeats": args.repeats,
            "sizes": args.sizes,
            "long_steps": args.long_steps,
            "waiting_jobs": args.waiting_jobs,
            "cpus": os.cpu_count(),
            "load_average_at_start": os.getloadavg()[0],
        }
    }
    with ExitStack() as stack:
        home = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="opd-curves-")))
        queue = stack.enter_context(redis_queue(args.redis_url))
        processes = Processes(home)
        stack.callback(processes.close)
        for name in args.databases:
            (home / name).mkdir()
            d = Deployment(name, stack.enter_context(database(name, home / name)))
            steps = ", ".join(f"{n:,}" for n in (*args.sizes, args.long_steps))
            progress(f"{name}: jobs of {steps} steps")
            migrate(d.url)
            asyncio.run(seed(d, args.sizes, args.long_steps))
            d.port = free_port()
            env = os.environ | {
                "OPD_HOME": str(home / name),
                "OPD_DATABASE_URL": d.url,
                "OPD_REDIS_URL": args.redis_url,
                "OPD_QUEUE_NAME": queue,
            }
            api = processes.command(
                f"API-{name}",
                [sys.executable, "-m", "opd.cli", "api", "--port", str(d.port), "--quiet"],
                env,
            )
            api.wait_until_serving(f"http://127.0.0.1:{d.port}/readyz")
            figures: dict[str, Any] = {"dashboard_load": dashboard_load(processes, d, args)}
            figures["long_job"] = long_job_reads(d, args.long_steps, args.repeats)
            progress(f"{name}: record_step before and after, {args.write_steps} steps each")
            figures["record_step"] = asyncio.run(write_cost(d.url, args.write_steps))
            progress(f"{name}: a requeuing pass over {args.waiting_jobs:,} waiting jobs")
            figures["requeue"] = asyncio.run(
                requeue_time(d.url, args.redis_url, f"{queue}-{name}", args.waiting_jobs)
            )
            result[name] = figures
        if args.compare_mlflow:
            url, store = stack.enter_context(mlflow_server(home, processes))
            result["mlflow"] = mlflow_reads(url, store, args.long_steps, args.repeats)
    result["settings"]["load_average_at_end"] = os.getloadavg()[0]
    return result


# --- the report -------------------------------------------------------------------------------


def pair(first: float | None, second: float | None) -> str:
    return f"{cell(first)} / {cell(second)}"


def triple(writes: dict[str, Any], figure: str) -> str:
    return " / ".join(cell(writes[name][figure]) for name in WRITES)


def ratio(writes: dict[str, Any], name: str) -> str:
    return f"{writes[name]['p50_ms'] / writes['before']['p50_ms']:.2f}x"


def table(result: dict[str, Any], names: Sequence[str]) -> list[str]:
    """One column per database: dashboard load, the long job, writes and a requeuing pass."""
    columns = "{:<44}" + "{:>22}" * len(names)
    figures = [result[name] for name in names]

    def row(label: str, values: Sequence[str]) -> str:
        return columns.format(label, *values)

    s = result["settings"]
    lines = [row("", names)]
    for steps in s["sizes"]:
        phases = [f["dashboard_load"][str(steps)] for f in figures]
        lines.append(
            row(
                f"{steps:,} steps: p50 / p99 (ms)", [pair(p["p50_ms"], p["p99_ms"]) for p in phases]
            )
        )
        lines.append(row("  chart p99 (ms)", [cell(p["chart"]["p99_ms"]) for p in phases]))
        lines.append(
            row("  errors / unfinished", [f"{p['errors']} / {p['unfinished']}" for p in phases])
        )
    longs = [f["long_job"] for f in figures]
    lines += [
        f"{s['long_steps']:,}-step job, {len(METRIC_NAMES)} metrics: sequential GETs over loopback",
        row(
            f"  {CURVE_POINTS:,}-point curve p50 / p99 (ms)",
            [pair(r["curve"]["p50_ms"], r["curve"]["p99_ms"]) for r in longs],
        ),
        row("  points returned", [str(r["curve"]["points"]) for r in longs]),
        row(
            "  unchanged poll (304) p50 (ms)", [cell(r["unchanged_poll"]["p50_ms"]) for r in longs]
        ),
        row(
            "  export CSV (s / MB)",
            [pair(r["export_csv"]["seconds"], r["export_csv"]["bytes"] / 1e6) for r in longs],
        ),
        row(
            "  export JSONL (s / MB)",
            [pair(r["export_jsonl"]["seconds"], r["export_jsonl"]["bytes"] / 1e6) for r in longs],
        ),
    ]
    if "mlflow" in result:
        theirs = result["mlflow"]["curve"]
        lines += [
            row(
                "  MLflow bulk-interval p50 / p99 (ms)",
                [pair(theirs["p50_ms"], theirs["p99_ms"])] * len(names),
            ),
            row(
                "  ours faster by",
                [f"{theirs['p50_ms'] / r['curve']['p50_ms']:.1f}x" for r in longs],
            ),
        ]
    writes = [f["record_step"] for f in figures]
    lines += [
        "record_step: 0001 (step row) / 0002 (+ summaries) / today (all kept per step)",
        row("  p50 (ms)", [triple(w, "p50_ms") for w in writes]),
        row("  p99 (ms)", [triple(w, "p99_ms") for w in writes]),
        row("  summaries alone, p50 ratio", [ratio(w, "store") for w in writes]),
        row(
            f"requeuing pass over {s['waiting_jobs']:,} waiting jobs (ms)",
            [cell(f["requeue"]["ms"]) for f in figures],
        ),
    ]
    return lines


def targets(result: dict[str, Any], names: Sequence[str]) -> list[str]:
    """Each target of issue 9 on each database: met or not, with the figure."""
    lines = []
    for name in names:
        figures = result[name]
        longest = result["settings"]["sizes"][-1]
        load = figures["dashboard_load"][str(longest)]
        curve = figures["long_job"]["curve"]["p50_ms"]
        export = figures["long_job"]["export_csv"]["seconds"]
        writes = figures["record_step"]
        write_ratio = writes["after"]["p50_ms"] / writes["before"]["p50_ms"]
        checks = [
            (
                f"{longest:,}-step dashboard load p99 <= {TARGET_LOAD_P99_MS:g} ms, no errors",
                load["p99_ms"] <= TARGET_LOAD_P99_MS and load["errors"] == load["unfinished"] == 0,
                f"{cell(load['p99_ms'])} ms",
            ),
            (
                f"{CURVE_POINTS:,}-point curve <= {TARGET_CURVE_MS:g} ms",
                curve <= TARGET_CURVE_MS,
                f"{cell(curve)} ms",
            ),
            (f"full export <= {TARGET_EXPORT_S:g} s", export <= TARGET_EXPORT_S, f"{export:.2f} s"),
            (
                f"record_step p50 <= {TARGET_WRITE_RATIO:g}x before",
                write_ratio <= TARGET_WRITE_RATIO,
                f"{write_ratio:.2f}x",
            ),
        ]
        if "mlflow" in result:
            faster = result["mlflow"]["curve"]["p50_ms"] / curve
            checks.append(
                (
                    f">= {TARGET_MLFLOW_RATIO:g}x faster than MLflow",
                    faster >= TARGET_MLFLOW_RATIO,
                    f"{faster:.1f}x",
                )
            )
        lines += [
            f"{name}: {what}: {'met' if ok else 'NOT met'} ({figure})"
            for what, ok, figure in checks
        ]
    return lines


def report(result: dict[str, Any]) -> str:
    s = result["settings"]
    names = [name for name in s["databases"] if name in result]
    return "\n".join(
        [
            f"Curves on {', '.join(names)}: {s['cpus']} CPUs, load average "
            f"{s['load_average_at_start']:.1f} at start, {s['load_average_at_end']:.1f} at the end "
            "(other processes share the CPUs: rerun when the machine is quiet)",
            f"Dashboard load: {s['dashboards']} dashboards, each GETs the job and its chart "
            f"(/metrics?{CHART}) every 2 s;",
            f"{s['duration_s']:g} s measured after {s['warmup_s']:g} s, while a writer records "
            f"{s['steps_per_second']:g} steps/s into the job; latency from the scheduled time.",
            "",
            *table(result, names),
            "",
            *targets(result, names),
        ]
    )


# --- the command line -------------------------------------------------------------------------


def sizes(text: str) -> list[int]:
    try:
        steps = sorted({int(part) for part in text.split(",")})
    except ValueError:
        raise argparse.ArgumentTypeError(f"comma-separated step counts, got {text}") from None
    if not steps or steps[0] < 1:
        raise argparse.ArgumentTypeError(f"step counts of at least 1, got {text}")
    return steps


def databases(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names or set(names) - {"sqlite", "postgres"}:
        raise argparse.ArgumentTypeError(f"sqlite, postgres or both (comma-separated), got {text}")
    return names


def parser() -> argparse.ArgumentParser:
    cli = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    cli.add_argument(
        "--databases",
        type=databases,
        default=["sqlite", "postgres"],
        help="sqlite,postgres (default both)",
    )
    cli.add_argument(
        "--dashboards", type=positive(int), default=100, help="dashboards polling (default 100)"
    )
    cli.add_argument(
        "--duration",
        type=positive(float),
        default=20.0,
        help="seconds measured per job size (default 20)",
    )
    cli.add_argument(
        "--warmup",
        type=positive(float),
        default=3.0,
        help="seconds of load before measuring (default 3)",
    )
    cli.add_argument(
        "--steps-per-second",
        type=positive(float),
        default=2.0,
        help="steps the writer records meanwhile (default 2)",
    )
    cli.add_argument(
        "--repeats", type=positive(int), default=50, help="sequential GETs per timing (default 50)"
    )
    cli.add_argument(
        "--write-steps",
        type=positive(int),
        default=400,
        help="steps per record_step timing (default 400)",
    )
    cli.add_argument(
        "--sizes",
        type=sizes,
        default=list(SIZES),
        help="steps of the jobs under dashboard load (default 200,1000,20000)",
    )
    cli.add_argument(
        "--long-steps",
        type=positive(int),
        default=LONG_STEPS,
        help=f"steps of the job whose curve and export are timed (default {LONG_STEPS:,})",
    )
    cli.add_argument(
        "--waiting-jobs",
        type=positive(int),
        default=WAITING_JOBS,
        help=f"queued jobs for the requeuing pass timing (default {WAITING_JOBS:,})",
    )
    cli.add_argument(
        "--compare-mlflow",
        action="store_true",
        help="pip install MLflow into a throwaway venv and time it on the same data",
    )
    cli.add_argument(
        "--redis-url", default="redis://127.0.0.1:6379/13", help="Redis for the API's queue"
    )
    cli.add_argument("--json", type=Path, metavar="PATH", help="also write the figures here")
    return cli


def main(argv: Sequence[str] | None = None) -> int:
    return run_benchmark(benchmark, report, parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
