"""What a sweep costs to read and to control: `GET /v1/sweeps/{id}` and `GET /v1/sweeps`
from a real `opd api` on Postgres, and one pass of the controller over the sweep (the
first, which judges every rung its trials reached, and the next), on a sweep of
`--trials` trials of `--steps` recorded steps each, seeded as real runs would have left it.

    python benchmarks/sweep_reads.py                      # 200 trials x 1,000 steps
    python benchmarks/sweep_reads.py --trials 20 --steps 100 --repeats 3 --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from harness import (
    Processes,
    latency_summary,
    positive,
    postgres_database,
    progress,
    redis_queue,
    run_benchmark,
)
from seeding import release, seed_sweep, sweep_definition
from sqlalchemy import text
from support import free_port

from app.auth.keys import create_key
from app.core.db import create_db_engine, migrate, session_factory
from app.jobs.limits import Limits
from app.jobs.schemas import JobStatus
from app.sweeps.control import advance, claim_sweeps

WRITER = "benchmark-writer"
CONTROLLER = "benchmark-controller"
RUNNING = 10
"""Trials still running (the last ones, a step before their end); the others succeeded."""


async def seed(url: str, trials: int, steps: int) -> tuple[str, int]:
    """A key and one sweep whose trials all recorded `steps` steps."""
    engine = create_db_engine(url)
    async with session_factory(engine)() as session:
        key = await create_key(session, "benchmark")
        definition = sweep_definition("reads", trials, steps, max(1, steps // 9))

        def progress_of(number: int) -> tuple[JobStatus, int]:
            if number > trials - RUNNING:
                return JobStatus.running, steps - 1
            return JobStatus.succeeded, steps

        sweep_id, _ = await seed_sweep(session, key.team.id, definition, progress_of, WRITER)
        await release(session, [sweep_id])
        await session.execute(text("ANALYZE"))  # as autovacuum would have by now
        await session.commit()
    await engine.dispose()
    return key.key, sweep_id


async def controller_passes(url: str, sweep_id: int) -> dict[str, float]:
    """Seconds of the controller's first pass over the sweep, and of the next."""
    engine = create_db_engine(url)
    passes = {}
    async with session_factory(engine)() as session:
        for name in ("first_pass", "next_pass"):
            began = time.perf_counter()
            assert sweep_id in await claim_sweeps(session, CONTROLLER, 600)
            await advance(session, sweep_id, CONTROLLER, Limits())
            passes[name] = time.perf_counter() - began
    await engine.dispose()
    return passes


def timings(client: httpx.Client, path: str, repeats: int) -> dict[str, Any]:
    """p50/p99 of sequential GETs after one untimed, and the answer's size."""
    seconds, size = [], 0
    for attempt in range(repeats + 1):
        began = time.perf_counter()
        response = client.get(path)
        if attempt:
            seconds.append(time.perf_counter() - began)
        response.raise_for_status()
        size = len(response.content)
    return {"requests": len(seconds), **latency_summary(seconds), "bytes": size}


def benchmark(args: argparse.Namespace) -> dict[str, Any]:
    result: dict[str, Any] = {"trials": args.trials, "steps": args.steps}
    with (
        tempfile.TemporaryDirectory(prefix="opd-sweep-reads-") as folder,
        postgres_database() as url,
        redis_queue(args.redis_url) as queue,
    ):
        home = Path(folder)
        processes = Processes(home)
        try:
            migrate(url)
            progress(f"seeding a sweep of {args.trials} trials x {args.steps:,} steps")
            key, sweep_id = asyncio.run(seed(url, args.trials, args.steps))
            port = free_port()
            env = os.environ | {
                "OPD_HOME": str(home),
                "OPD_DATABASE_URL": url,
                "OPD_REDIS_URL": args.redis_url,
                "OPD_QUEUE_NAME": queue,
            }
            api = processes.command(
                "API", [sys.executable, "-m", "opd.cli", "api", "--port", str(port), "--quiet"], env
            )
            api.wait_until_serving(f"http://127.0.0.1:{port}/readyz")
            headers = {"Authorization": f"Bearer {key}"}
            with httpx.Client(
                base_url=f"http://127.0.0.1:{port}", headers=headers, timeout=120
            ) as client:
                progress(f"{args.repeats} reads of each")
                result["detail"] = timings(client, f"/v1/sweeps/{sweep_id}", args.repeats)
                result["list"] = timings(client, "/v1/sweeps", args.repeats)
            progress("two controller passes")
            result |= asyncio.run(controller_passes(url, sweep_id))
        finally:
            processes.close()
    return result


def report(result: dict[str, Any]) -> str:
    lines = [f"a sweep of {result['trials']} trials x {result['steps']:,} steps, on Postgres"]
    for name, label in (("detail", "GET /v1/sweeps/{id}"), ("list", "GET /v1/sweeps")):
        figures = result[name]
        lines.append(
            f"{label:<22} p50 {figures['p50_ms']:.1f} ms, p99 {figures['p99_ms']:.1f} ms "
            f"({figures['bytes']:,} bytes)"
        )
    lines.append(
        f"controller pass        first {result['first_pass'] * 1000:.1f} ms, "
        f"next {result['next_pass'] * 1000:.1f} ms"
    )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=positive(int), default=200, help="at most 200")
    parser.add_argument("--steps", type=positive(int), default=1000, help="steps per trial")
    parser.add_argument("--repeats", type=positive(int), default=20, help="timed reads of each")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/13")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    return run_benchmark(benchmark, report, parser.parse_args())


if __name__ == "__main__":
    sys.exit(main())
