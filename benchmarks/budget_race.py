"""Budgets under a race (issue 47, "Prove it"): a budget team's completions, chat
completions, playground calls and jobs race at its limit from several clients through two
`opd api` processes and one `opd worker` (2 slots), and its spend never passes the budget
by more than one step per job running when the limit was reached; requests add nothing
past it (each holds its most before it starts).

Trains a tiny job (examples/tiny.yaml, shrunk) whose weights the requests sample, then
gives the team a budget of what it spent plus --room tokens. --clients clients, half on
each API, send in turn a completion (n 4, --max-tokens), a chat completion and a
playground call of the job, and the first --jobs of them submit a job of 40 steps first,
until every client has been refused --refusals times in a row (or --seconds pass). Then
the jobs pause (or end), and the team's spend is read: its overshoot, in steps of the
largest step any job recorded, must be at most the jobs that ran (the bound); exits 1 when
it is not.

    python benchmarks/budget_race.py                              # Postgres
    python benchmarks/budget_race.py --database sqlite --clients 6 --room 3000
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import yaml
from harness import (
    BenchmarkError,
    Processes,
    opd,
    positive,
    postgres_database,
    progress,
    redis_queue,
    run_benchmark,
)
from sqlalchemy import select
from support import free_port

from app.core.db import create_sync_engine
from app.curves.tables import StepMetric
from app.jobs.tables import Job
from app.usage.store import USAGE_METRICS

ROOT = Path(__file__).resolve().parents[1]
TEAM = "race"
APIS = 2
PROMPT = "What is 2 + 3?"
ENDED = {"succeeded", "failed", "cancelled", "paused"}


def spec(steps: int) -> dict[str, Any]:
    """examples/tiny.yaml without its eval, `steps` long, light steps."""
    tiny = yaml.safe_load((ROOT / "examples" / "tiny.yaml").read_text())
    del tiny["eval"]
    tiny["loop"] |= {"steps": steps, "batch_size": 2, "group_size": 2, "keep_samples": 0}
    tiny["sampling"] = {"max_tokens": 16}
    tiny["local"] = {"device": "cpu"}
    return tiny


async def settle(client: httpx.AsyncClient, job_id: int, seconds: float = 600) -> dict[str, Any]:
    """The job once it paused or ended."""
    deadline = time.monotonic() + seconds
    while (job := (await client.get(f"/v1/jobs/{job_id}")).json())["status"] not in ENDED:
        if time.monotonic() > deadline:
            raise BenchmarkError(f"job {job_id} neither paused nor ended: {job['status']}")
        await asyncio.sleep(0.5)
    return job


def requests_of(job_id: int, max_tokens: int) -> list[tuple[str, str, dict[str, Any]]]:
    """The three doors' requests, each asking for 4 completions of `max_tokens`."""
    model, asked = f"job-{job_id}", {"max_tokens": max_tokens, "n": 4}
    messages = [{"role": "user", "content": PROMPT}]
    return [
        ("completions", "/v1/completions", {"model": model, "prompt": PROMPT, **asked}),
        ("chat", "/v1/chat/completions", {"model": model, "messages": messages, **asked}),
        ("playground", f"/v1/jobs/{job_id}/playground", {"prompt": PROMPT, **asked}),
    ]


async def client_run(
    client: httpx.AsyncClient,
    job_id: int,
    submits: bool,
    args: argparse.Namespace,
    answers: Counter[tuple[str, int]],
    jobs: list[int],
) -> None:
    """One client: a job first (when it `submits`), then the doors in turn, until refused
    `args.refusals` times in a row or the time is up."""
    if submits:
        made = await client.post("/v1/jobs", json=spec(40))
        answers["job", made.status_code] += 1
        if made.status_code == 201:
            jobs.append(made.json()["id"])
    refused, deadline = 0, time.monotonic() + args.seconds
    doors = requests_of(job_id, args.max_tokens)
    turn = 0
    while refused < args.refusals and time.monotonic() < deadline:
        name, url, body = doors[turn % len(doors)]
        turn += 1
        answer = await client.post(url, json=body)
        answers[name, answer.status_code] += 1
        if answer.status_code == 429 and "budget" in answer.json():
            refused += 1
        elif answer.status_code == 200:
            refused = 0
        else:
            raise BenchmarkError(f"{name}: {answer.status_code} {answer.text[:500]}")


def largest_step(database_url: str, team_id: int) -> int:
    """The most tokens any step of the team's jobs recorded."""
    engine = create_sync_engine(database_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                select(StepMetric.metrics)
                .join(Job, Job.id == StepMetric.job_id)
                .where(Job.team_id == team_id)
            )
            return max(
                (
                    sum(round(metrics.get(name) or 0) for name in USAGE_METRICS)
                    for (metrics,) in rows
                ),
                default=0,
            )
    finally:
        engine.dispose()


async def race(
    urls: list[str], key: str, admin: str, database_url: str, args: argparse.Namespace
) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {key}"}
    clients = [
        httpx.AsyncClient(base_url=urls[index % len(urls)], headers=headers, timeout=300)
        for index in range(args.clients)
    ]
    ops = httpx.AsyncClient(
        base_url=urls[0], headers={"Authorization": f"Bearer {admin}"}, timeout=60
    )
    try:
        progress("training the tiny job whose weights the requests sample")
        trained = (await clients[0].post("/v1/jobs", json=spec(2))).json()
        trained = await settle(clients[0], trained["id"])
        if trained["status"] != "succeeded":
            raise BenchmarkError(f"the tiny job ended {trained['status']}: {trained['error']}")
        budget_url = f"/v1/teams/{TEAM}/budget"
        spent = (await ops.put(budget_url, json={"tokens": 10**12})).json()["used"]
        limit = int(spent) + args.room
        await ops.put(budget_url, json={"tokens": limit})
        progress(f"racing {args.clients} clients on {len(urls)} APIs at a budget of {limit}")
        answers: Counter[tuple[str, int]] = Counter()
        jobs: list[int] = []
        began = time.perf_counter()
        await asyncio.gather(
            *(
                client_run(client, trained["id"], index < args.jobs, args, answers, jobs)
                for index, client in enumerate(clients)
            )
        )
        seconds = time.perf_counter() - began
        ended = [await settle(clients[0], job_id) for job_id in jobs]
        after = (await ops.get(budget_url)).json()
    finally:
        for client in (*clients, ops):
            await client.aclose()
    step = largest_step(database_url, after["team_id"])
    over = after["used"] - limit
    ran = sum(job["steps_done"] > 0 for job in ended)
    return {
        "clients": args.clients,
        "apis": len(urls),
        "seconds": round(seconds, 1),
        "budget": limit,
        "room": args.room,
        "spent": after["used"],
        "held_after": after["held"],
        "overshoot_tokens": over,
        "largest_step_tokens": step,
        "overshoot_steps": round(over / step, 2) if step else None,
        "jobs_ran": ran,
        "jobs": {
            job["id"]: [job["status"], job["stop_reason"], job["steps_done"]] for job in ended
        },
        "answers": {f"{name} {code}": count for (name, code), count in sorted(answers.items())},
        "holds": over <= ran * step,
    }


def benchmark(args: argparse.Namespace) -> dict[str, Any]:
    with (
        tempfile.TemporaryDirectory(prefix="opd-budget-race-") as folder,
        redis_queue(args.redis_url) as queue,
    ):
        home = Path(folder)
        if args.database == "sqlite":
            return deployed(home, f"sqlite:///{home / 'opd.db'}", queue, args)
        with postgres_database() as url:
            return deployed(home, url, queue, args)


def deployed(home: Path, database_url: str, queue: str, args: argparse.Namespace) -> dict[str, Any]:
    env = os.environ | {
        "PYTHONPATH": str(ROOT),
        "OPD_HOME": str(home),
        "OPD_DATABASE_URL": database_url,
        "OPD_REDIS_URL": args.redis_url,
        "OPD_QUEUE_NAME": queue,
        "OPD_WORKER_CONCURRENCY": "2",
        "OPD_REQUEUE_INTERVAL": "2",
        "OPD_TEAM_MAX_WAITING": "64",
        "OMP_NUM_THREADS": "1",
        "TORCHINDUCTOR_CACHE_DIR": str(home / "torchinductor"),
    }
    processes = Processes(home)
    try:
        opd(env, "migrate")
        key = opd(env, "keys", "create", "--team", TEAM)
        admin = opd(env, "keys", "create", "--team", "ops", "--scope", "admin")
        urls = [f"http://127.0.0.1:{free_port()}" for _ in range(APIS)]
        apis = [
            processes.command(
                f"api-{index}",
                [
                    sys.executable,
                    "-m",
                    "opd.cli",
                    "api",
                    "--port",
                    url.rsplit(":", 1)[1],
                    "--quiet",
                ],
                env,
            )
            for index, url in enumerate(urls)
        ]
        processes.command("worker", [sys.executable, "-m", "opd.cli", "worker"], env)
        for api, url in zip(apis, urls, strict=True):
            api.wait_until_serving(f"{url}/healthz")
        return asyncio.run(race(urls, key, admin, database_url, args))
    finally:
        processes.close()


def report(figures: dict[str, Any]) -> str:
    lines = [
        f"{figures['clients']} clients on {figures['apis']} APIs for {figures['seconds']} s, "
        f"budget {figures['budget']:,} tokens ({figures['room']:,} left at the start)",
        *(f"  {name:<18} {count}" for name, count in figures["answers"].items()),
        f"spent {figures['spent']:,.0f}: {figures['overshoot_tokens']:+,.0f} tokens past the "
        f"budget = {figures['overshoot_steps']} of the largest step "
        f"({figures['largest_step_tokens']} tokens); bound: {figures['jobs_ran']} step(s), one "
        f"per job that ran; held after: {figures['held_after']:.0f}",
        "jobs: " + ", ".join(f"{job_id} {end}" for job_id, end in figures["jobs"].items()),
        "PASS" if figures["holds"] else "FAIL: the spend passed the bound",
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database", choices=["postgres", "sqlite"], default="postgres")
    parser.add_argument("--clients", type=positive(int), default=8)
    parser.add_argument("--jobs", type=int, default=2, help="clients that submit a job first")
    parser.add_argument("--room", type=positive(int), default=4000, help="tokens left at the start")
    parser.add_argument("--max-tokens", type=positive(int), default=64, help="per completion")
    parser.add_argument("--refusals", type=positive(int), default=3)
    parser.add_argument("--seconds", type=positive(float), default=120)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/13")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    held: list[bool] = []

    def reported(figures: dict[str, Any]) -> str:
        held.append(figures["holds"])
        return report(figures)

    code = run_benchmark(benchmark, reported, parser.parse_args())
    return 1 if code == 0 and not all(held) else code


if __name__ == "__main__":
    sys.exit(main())
