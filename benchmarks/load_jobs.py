"""Load: many clients submit jobs at once against Postgres, and no job may be lost or doubled.

Starts a throwaway deployment (a fresh Postgres database, a private arq queue on Redis,
`opd api` and `opd worker` processes), lets --clients concurrent clients POST --jobs tiny
jobs, each with its own Idempotency-Key, waits up to --timeout seconds for the workers,
prints the figures and checks that

- nothing is duplicated: each key got one job id in every answer and one row in the table;
- nothing is lost: every accepted job is in the database, and every job still queued has
  a live arq message or a queue_reason (the requeuer re-sends any other), and no active job
  has lost its worker's heartbeat.

Clients retry a transport error or a 5xx with the same key; on top of that some requests
are deliberately sent twice at once, some abandoned before the answer and sent again, and
some jobs cancelled right after their creation. Exits 1 when a check fails (the
deployment's logs are kept and their folder printed), 130 on Ctrl-C; everything started
is stopped and removed on the way out.

    python benchmarks/load_jobs.py                           # 1,000 jobs, 20 clients
    python benchmarks/load_jobs.py --jobs 30 --clients 5 --timeout 20
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import psycopg
import yaml
from harness import interrupt
from redis.exceptions import RedisError
from sqlalchemy import func, make_url, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from support import free_port, fresh_database, percentile, private_queue, wait_until_healthy

from app.core.db import create_db_engine, session_factory
from app.core.queue import JobQueue
from app.core.tables import utcnow
from app.jobs.schemas import ACTIVE_STATUSES, TERMINAL_STATUSES, JobStatus
from app.jobs.tables import Job

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "examples" / "tiny.yaml"
REQUEUE_INTERVAL = 5.0
HEARTBEAT_TIMEOUT = 60.0
REQUEST_TIMEOUT = 60.0
ABANDON_AFTER = 0.005  # seconds a deliberately abandoned request waits for its answer
MAX_ATTEMPTS = 12
STARTUP_TIMEOUT = 120.0
STOP_TIMEOUT = 60.0
PROGRESS_EVERY = 15.0
INTERRUPTED = 130
Sessions = async_sessionmaker[AsyncSession]


class ChecksFailed(Exception):
    """Something was lost or duplicated (the figures above say what)."""


# --- the deployment ---------------------------------------------------------------------------


@contextmanager
def scratch_home() -> Iterator[Path]:
    """OPD_HOME (logs, artifacts): removed after a clean run, kept after a failure."""
    home = Path(tempfile.mkdtemp(prefix="opd-load-"))
    try:
        yield home
    except Exception:
        print(f"Logs kept in {home}", file=sys.stderr)
        raise
    except KeyboardInterrupt:
        shutil.rmtree(home, ignore_errors=True)
        raise
    shutil.rmtree(home, ignore_errors=True)


@dataclass
class Deployment:
    home: Path
    env: dict[str, str]
    database_url: str
    queue_name: str
    api_urls: list[str] = field(default_factory=list)
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def opd(self, *args: str) -> str:
        """Run an `opd` command to completion; its standard output."""
        done = subprocess.run(
            [sys.executable, "-m", "opd.cli", *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=STARTUP_TIMEOUT,
        )
        if done.returncode != 0:
            raise RuntimeError(f"opd {' '.join(args)} failed:\n{done.stderr}")
        return done.stdout

    def spawn(self, name: str, *args: str, **env: str) -> subprocess.Popen[bytes]:
        """Start an `opd` process in its own session (Ctrl-C reaches only this script,
        which then stops the processes in order), logging to <home>/<name>.log."""
        with (self.home / f"{name}.log").open("ab") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "opd.cli", *args],
                env=self.env | env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.processes.append(process)
        return process

    def start_api(self, name: str) -> None:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        process = self.spawn(name, "api", "--port", str(port), "--quiet")
        wait_until_healthy(url, process, STARTUP_TIMEOUT, f"{name} (see {self.home / name}.log)")
        self.api_urls.append(url)

    def stop(self) -> None:
        """SIGTERM everything (workers drain: running jobs requeue), then kill stragglers."""
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT
        for process in self.processes:
            try:
                process.wait(max(0.0, deadline - time.monotonic()))
            except (subprocess.TimeoutExpired, KeyboardInterrupt):
                process.kill()
                process.wait()


@contextmanager
def deployment(options: argparse.Namespace) -> Iterator[Deployment]:
    """The whole service on a fresh database and queue, torn down afterwards."""
    with ExitStack() as stack:
        database_url = stack.enter_context(fresh_database(options.postgres, "opd_load"))
        queue_name = stack.enter_context(private_queue(options.redis, "opd-load"))
        home = stack.enter_context(scratch_home())
        env = os.environ | {
            "PYTHONPATH": str(ROOT),
            "OPD_HOME": str(home),
            "OPD_DATABASE_URL": database_url,
            "OPD_REDIS_URL": options.redis,
            "OPD_QUEUE_NAME": queue_name,
            "OPD_WORKER_CONCURRENCY": str(options.concurrency),
            "OPD_REQUEUE_INTERVAL": str(REQUEUE_INTERVAL),
            "OPD_HEARTBEAT_TIMEOUT": str(HEARTBEAT_TIMEOUT),
        }
        service = Deployment(home, env, database_url, queue_name)
        print(
            f"Deployment: Postgres database {make_url(database_url).database}, "
            f"queue {queue_name} on {options.redis}, OPD_HOME {home}",
            flush=True,
        )
        stack.callback(service.stop)
        service.opd("migrate")
        for index in range(options.apis):
            service.start_api(f"api-{index}")
        for index in range(options.workers):
            service.spawn(f"worker-{index}", "worker")
        yield service


# --- the clients ------------------------------------------------------------------------------


@dataclass
class Submission:
    """One job a client submits, and what the service answered about it."""

    key: str
    spec: dict[str, Any]
    repeat: bool  # sent twice at once
    abandon: bool  # first attempt abandoned before its answer
    cancel: bool  # cancelled once accepted
    job_ids: set[int] = field(default_factory=set)


@dataclass
class RequestStats:
    """What the clients saw of one kind of request."""

    latencies: list[float] = field(default_factory=list)
    answers: Counter[int] = field(default_factory=Counter)
    abandoned: int = 0
    transport_errors: Counter[str] = field(default_factory=Counter)
    server_errors: Counter[str] = field(default_factory=Counter)
    rejected: Counter[str] = field(default_factory=Counter)
    gave_up: int = 0


@dataclass
class Traffic:
    submits: RequestStats = field(default_factory=RequestStats)
    cancels: RequestStats = field(default_factory=RequestStats)
    cancel_outcomes: Counter[str] = field(default_factory=Counter)


def tiny_spec(index: int) -> dict[str, Any]:
    """examples/tiny.yaml cut to one step of one two-token sample, without its eval:
    seconds on a CPU."""
    spec = yaml.safe_load(TINY.read_text())
    del spec["eval"]
    spec["name"] = f"load-{index}"
    spec["student"]["seed"] = index
    spec["loop"] |= {"steps": 1, "batch_size": 1, "group_size": 1}
    spec["sampling"]["max_tokens"] = 2
    return spec


def plan(options: argparse.Namespace, run_id: str) -> list[Submission]:
    chance = random.Random(options.seed)
    return [
        Submission(
            key=f"load-{run_id}-{index}",
            spec=tiny_spec(index),
            repeat=chance.random() < options.repeat_share,
            abandon=chance.random() < options.abandon_share,
            cancel=chance.random() < options.cancel_share,
        )
        for index in range(options.jobs)
    ]


async def backoff(attempt: int) -> None:
    await asyncio.sleep(min(2.0, 0.05 * 2**attempt))


def error_text(response: httpx.Response) -> str:
    return f"{response.status_code} {response.text[:200]}"


async def send(
    stats: RequestStats,
    request: Callable[[httpx.Timeout], Awaitable[httpx.Response]],
    abandon: bool = False,
) -> httpx.Response | None:
    """The request's answer, retried on a transport error or a 5xx; None if it never
    came. `abandon`: give the first attempt no time to answer, as a client whose
    connection broke mid-request would, and send it again."""
    for attempt in range(MAX_ATTEMPTS):
        abandoning = abandon and attempt == 0
        timeout = httpx.Timeout(REQUEST_TIMEOUT, read=ABANDON_AFTER if abandoning else None)
        started = time.perf_counter()
        try:
            response = await request(timeout)
        except httpx.TransportError as error:
            if abandoning and isinstance(error, httpx.ReadTimeout):
                stats.abandoned += 1
                continue
            stats.transport_errors[type(error).__name__] += 1
            await backoff(attempt)
            continue
        stats.latencies.append(time.perf_counter() - started)
        stats.answers[response.status_code] += 1
        if response.status_code < 500:
            return response
        stats.server_errors[error_text(response)] += 1
        await backoff(attempt)
    stats.gave_up += 1
    return None


async def post_job(
    http: httpx.AsyncClient, stats: RequestStats, job: Submission, abandon: bool
) -> None:
    response = await send(
        stats,
        lambda timeout: http.post(
            "/v1/jobs", json=job.spec, headers={"Idempotency-Key": job.key}, timeout=timeout
        ),
        abandon,
    )
    if response is None:
        return
    if response.status_code in (200, 201):
        job.job_ids.add(response.json()["id"])
    else:
        stats.rejected[error_text(response)] += 1


async def cancel_job(http: httpx.AsyncClient, traffic: Traffic, job_id: int) -> None:
    response = await send(
        traffic.cancels, lambda timeout: http.post(f"/v1/jobs/{job_id}/cancel", timeout=timeout)
    )
    if response is None:
        traffic.cancel_outcomes["unanswered"] += 1
    elif response.status_code == 409:
        traffic.cancel_outcomes["too late (already ended)"] += 1
    elif response.is_success:
        traffic.cancel_outcomes[response.json()["status"]] += 1
    else:
        traffic.cancels.rejected[error_text(response)] += 1


async def client(url: str, key: str, work: asyncio.Queue[Submission], traffic: Traffic) -> None:
    """Submit jobs from `work` one after the other until it is empty."""
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(base_url=url, headers=headers) as http:
        while not work.empty():
            job = work.get_nowait()
            posts = [post_job(http, traffic.submits, job, job.abandon)]
            if job.repeat:
                posts.append(post_job(http, traffic.submits, job, abandon=False))
            await asyncio.gather(*posts)
            if job.cancel and len(job.job_ids) == 1:
                await cancel_job(http, traffic, next(iter(job.job_ids)))


async def submit_all(
    service: Deployment, key: str, jobs: list[Submission], clients: int
) -> tuple[Traffic, float]:
    work: asyncio.Queue[Submission] = asyncio.Queue()
    for job in jobs:
        work.put_nowait(job)
    traffic = Traffic()
    started = time.perf_counter()
    await asyncio.gather(
        *(
            client(service.api_urls[index % len(service.api_urls)], key, work, traffic)
            for index in range(clients)
        )
    )
    return traffic, time.perf_counter() - started


# --- waiting and checking ---------------------------------------------------------------------


def unfinished(counts: Counter[str]) -> int:
    return sum(n for status, n in counts.items() if status not in TERMINAL_STATUSES)


def describe_counts(counts: Counter[str]) -> str:
    order = [status.value for status in JobStatus]
    return ", ".join(f"{status} {counts[status]}" for status in order if counts[status])


async def status_counts(sessions: Sessions) -> Counter[str]:
    async with sessions() as session:
        rows = await session.execute(select(Job.status, func.count()).group_by(Job.status))
    return Counter({status: count for status, count in rows.all()})


async def wait_for_workers(sessions: Sessions, timeout: float) -> float:
    """Poll until every job has ended or `timeout` passes; returns the seconds waited."""
    started = last_report = time.monotonic()
    while True:
        counts = await status_counts(sessions)
        waited = time.monotonic() - started
        if not unfinished(counts) or waited >= timeout:
            return waited
        if time.monotonic() - last_report >= PROGRESS_EVERY:
            last_report = time.monotonic()
            print(f"  [{waited:4.0f} s] {describe_counts(counts)}", flush=True)
        await asyncio.sleep(1.0)


async def all_jobs(sessions: Sessions) -> list[Job]:
    async with sessions() as session:
        return list((await session.execute(select(Job).order_by(Job.id))).scalars())


@dataclass
class QueuedJobs:
    """The queued jobs at one moment, by what should bring a worker to them."""

    count: int = 0
    with_message: int = 0
    with_reason: int = 0
    neither: set[int] = field(default_factory=set)


async def look_at_queued(sessions: Sessions, queue: JobQueue) -> QueuedJobs:
    async with sessions() as session:
        query = select(Job.id, Job.enqueue_count, Job.queue_reason)
        waiting = (await session.execute(query.where(Job.status == JobStatus.queued))).all()
    seen = QueuedJobs(count=len(waiting))
    for job_id, enqueue_count, reason in waiting:
        pending = await queue.is_pending(job_id, enqueue_count)
        seen.with_message += pending
        seen.with_reason += reason is not None
        if not pending and reason is None:
            seen.neither.add(job_id)
    return seen


async def lost_in_queue(sessions: Sessions, queue: JobQueue) -> tuple[QueuedJobs, set[int]]:
    """The queued jobs at first look, and those without a message or a reason both then and
    two sweeps later (a message is missing for a moment between a send's count and push)."""
    first = await look_at_queued(sessions, queue)
    if not first.neither:
        return first, set()
    await asyncio.sleep(2 * REQUEUE_INTERVAL + 1)
    return first, first.neither & (await look_at_queued(sessions, queue)).neither


def ms(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds * 1000:.0f} ms"


def span(first: datetime, last: datetime) -> float:
    return max((last - first).total_seconds(), 1e-9)


def report_requests(what: str, stats: RequestStats) -> None:
    latencies = stats.latencies
    answers = ", ".join(f"{code} x{n}" for code, n in sorted(stats.answers.items()))
    print(
        f"{what}: {len(latencies)} answered ({answers}); latency "
        f"p50 {ms(percentile(latencies, 0.5))}, p99 {ms(percentile(latencies, 0.99))}, "
        f"max {ms(max(latencies, default=0.0))}"
    )
    errors = sum(stats.transport_errors.values()) + sum(stats.server_errors.values())
    print(
        f"  retried after an error: {errors}; given up after {MAX_ATTEMPTS} tries: {stats.gave_up}"
    )
    for name, count in stats.transport_errors.most_common():
        print(f"  transport error {name}: {count}")
    for text, count in stats.server_errors.most_common(5):
        print(f"  server error x{count}: {text}")
    for text, count in stats.rejected.most_common(5):
        print(f"  rejected x{count}: {text}")


def report_submissions(jobs: list[Submission], traffic: Traffic, seconds: float) -> None:
    accepted = sum(1 for job in jobs if job.job_ids)
    print(
        f"POST throughput: {accepted} of {len(jobs)} jobs accepted in {seconds:.1f} s = "
        f"{accepted / seconds:.1f} jobs/s"
    )
    report_requests("POST /v1/jobs", traffic.submits)
    print(
        f"  deliberate retries: {sum(job.repeat for job in jobs)} jobs sent twice at once, "
        f"{traffic.submits.abandoned} requests abandoned before their answer and sent again"
    )
    if traffic.cancels.answers or traffic.cancel_outcomes:
        report_requests("POST /v1/jobs/{id}/cancel", traffic.cancels)
        outcomes = ", ".join(f"{what} {n}" for what, n in traffic.cancel_outcomes.most_common())
        print(f"  outcomes: {outcomes}")


def report_outcome(rows: list[Job], waited: float) -> None:
    counts = Counter(job.status for job in rows)
    print(f"Final status after {waited:.0f} s of waiting: {describe_counts(counts)}")
    ran = [job for job in rows if job.started_at and job.finished_at]
    if ran:
        first = min(job.started_at for job in ran)
        last = max(job.finished_at for job in ran)
        print(
            f"Worker throughput: {len(ran)} jobs run to their end in {span(first, last):.1f} s "
            f"= {len(ran) / span(first, last):.2f} jobs/s"
        )
        waits = [span(job.created_at, job.started_at) for job in ran]
        print(
            f"Wait from submission to start: p50 {percentile(waits, 0.5) or 0:.1f} s, "
            f"max {max(waits):.1f} s"
        )
    print(
        f"Jobs started more than once: {sum(job.attempts > 1 for job in rows)}; "
        f"sent to the queue more than once: {sum(job.enqueue_count > 1 for job in rows)}"
    )
    failed = [job for job in rows if job.status == JobStatus.failed]
    for code, count in Counter(job.error_code for job in failed).most_common():
        print(f"Failed with {code}: {count}")
    for job in failed[:10]:
        message = (job.error_message or "").splitlines()[0][:160] if job.error_message else ""
        print(f"  job {job.id}: {job.error_code}: {message}")


@dataclass
class Verdict:
    duplicated: int
    lost: int

    @property
    def passed(self) -> bool:
        return self.duplicated == 0 and self.lost == 0


async def check(
    service: Deployment, sessions: Sessions, jobs: list[Submission], rows: list[Job]
) -> Verdict:
    """Duplicates and losses, printed with how they were counted."""
    keys = {job.key for job in jobs}
    accepted = {job_id for job in jobs for job_id in job.job_ids}
    answered_twice = sum(len(job.job_ids) - 1 for job in jobs if len(job.job_ids) > 1)
    rows_per_key = Counter(job.idempotency_key for job in rows)
    extra_rows = sum(n - 1 for key, n in rows_per_key.items() if key in keys and n > 1)
    unknown_rows = sum(n for key, n in rows_per_key.items() if key not in keys)
    duplicated = answered_twice + extra_rows + unknown_rows
    print(
        f"Duplicated: {duplicated} ({len(keys)} keys; {len(accepted)} distinct job ids answered; "
        f"{len(rows)} rows in the jobs table; keys answered with two ids {answered_twice}, "
        f"extra rows for a key {extra_rows}, rows with no key of ours {unknown_rows})"
    )

    missing = accepted - {job.id for job in rows}
    queue = JobQueue(service.env["OPD_REDIS_URL"], service.queue_name)
    try:
        queued, stranded = await lost_in_queue(sessions, queue)
    finally:
        await queue.close()
    stale_before = utcnow() - timedelta(seconds=HEARTBEAT_TIMEOUT)
    active = [job for job in rows if job.status in ACTIVE_STATUSES]
    stuck = [job for job in active if job.heartbeat_at is None or job.heartbeat_at < stale_before]
    lost = len(missing) + len(stranded) + len(stuck)
    print(
        f"Still queued: {queued.count} ({queued.with_message} with a live arq message, "
        f"{queued.with_reason} with a queue_reason, {len(queued.neither)} with neither at "
        f"first look, {len(stranded)} of them still after two sweeps)"
    )
    print(
        f"Lost: {lost} (accepted ids missing from the database {len(missing)}, lost in the "
        f"queue {len(stranded)}, active without a heartbeat for {HEARTBEAT_TIMEOUT:.0f} s "
        f"{len(stuck)})"
    )
    for job_id in sorted(missing | stranded | {job.id for job in stuck})[:20]:
        print(f"  lost: job {job_id}")
    return Verdict(duplicated=duplicated, lost=lost)


async def measure(options: argparse.Namespace, service: Deployment, key: str) -> Verdict:
    engine = create_db_engine(service.database_url)
    sessions = session_factory(engine)
    try:
        jobs = plan(options, uuid.uuid4().hex[:8])
        print(f"Submitting {len(jobs)} jobs from {options.clients} clients...", flush=True)
        traffic, seconds = await submit_all(service, key, jobs, options.clients)
        report_submissions(jobs, traffic, seconds)
        timeout = options.timeout if options.workers else 0.0
        print(f"Waiting up to {timeout:.0f} s for the workers...", flush=True)
        waited = await wait_for_workers(sessions, timeout)
        rows = await all_jobs(sessions)
        report_outcome(rows, waited)
        return await check(service, sessions, jobs, rows)
    finally:
        await engine.dispose()


# --- the command ------------------------------------------------------------------------------


def share(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text} is not a share between 0 and 1")
    return value


def whole_number(least: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        if not text.isdigit() or int(text) < least:
            raise argparse.ArgumentTypeError(f"{text} is not a whole number >= {least}")
        return int(text)

    return parse


positive = whole_number(1)
non_negative = whole_number(0)


def parse_options(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Submit many jobs at once; check that none is lost or duplicated."
    )
    parser.add_argument("--jobs", type=positive, default=1000, help="jobs to submit (1000)")
    parser.add_argument("--clients", type=positive, default=20, help="concurrent clients (20)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds to wait for workers")
    parser.add_argument(
        "--workers",
        type=non_negative,
        default=2,
        help="worker processes (2; 0 = the API side alone)",
    )
    parser.add_argument("--concurrency", type=positive, default=2, help="jobs per worker (2)")
    parser.add_argument("--apis", type=positive, default=2, help="API processes (2)")
    parser.add_argument("--repeat-share", type=share, default=0.05, help="jobs sent twice at once")
    parser.add_argument(
        "--abandon-share", type=share, default=0.02, help="jobs whose first POST is abandoned"
    )
    parser.add_argument("--cancel-share", type=share, default=0.05, help="jobs cancelled")
    parser.add_argument("--seed", type=int, default=0, help="which jobs repeat, abandon, cancel")
    parser.add_argument(
        "--postgres",
        default="postgresql://postgres@127.0.0.1:5432/postgres",
        help="admin URL of the Postgres server (a database is created and dropped there)",
    )
    parser.add_argument(
        "--redis", default="redis://127.0.0.1:6379/12", help="Redis URL (a private queue there)"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    options = parse_options(argv)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM cleans up like Ctrl-C
    # Ctrl-C raises where the event loop is, as SIGTERM does: asyncio's own handler would
    # only cancel the main task, and a cancel landing inside a database call was seen to be
    # swallowed (the run then went on to its end).
    signal.signal(signal.SIGINT, interrupt)
    print(
        f"Load: {options.jobs} jobs, {options.clients} clients, {options.apis} API processes, "
        f"{options.workers} workers x {options.concurrency} jobs",
        flush=True,
    )
    try:
        with deployment(options) as service:
            key = service.opd("keys", "create", "--team", "load").strip()
            verdict = asyncio.run(measure(options, service, key))
            if not verdict.passed:
                raise ChecksFailed
    except ChecksFailed:
        print("FAIL: jobs were lost or duplicated")
        return 1
    except KeyboardInterrupt:
        print("Interrupted; everything it started is stopped.", file=sys.stderr)
        return INTERRUPTED
    except (RuntimeError, OSError, psycopg.Error, RedisError) as error:
        print(f"load_jobs: {error}", file=sys.stderr)
        return 1
    print("PASS: none lost, none duplicated")
    return 0


if __name__ == "__main__":
    sys.exit(main())
