"""The playground's latency on the tiny models: `POST /v1/jobs/{id}/playground`, answered by a
real `opd worker` through Redis, from a client on the loopback.

Trains a tiny job that saves sampler weights after every step, then measures
1. warm: the final weights and the teacher already loaded in the worker's cache, the same
   request again and again (`--warm` times, after one untimed warm-up);
2. cold: each request asks for weights the worker has not loaded (a step not asked before,
   `--cold` of them; the cache holds 2 samplers, so none is kept for long), so the worker
   loads the base model and merges that step's LoRA into it; the teacher stays loaded;
3. the first request after the worker started (it also connects the backend and loads the
   teacher);
4. warm again, while the worker's sweep controller runs `--sweeps` sweeps of `--trials`
   trials of `--sweep-steps` steps (ASHA), seeded straight into the database as their runs
   would have left it and run on by a writer that records their steps and beats for them as
   their workers would; side by side with (1), with the worker's heartbeats of a job it
   runs meanwhile (every second) watched in both.
Each request completes one prompt with `--max-tokens` tokens, compared with the teacher
(its scores and the reverse KL included). Figures are the client's wall time, and the
worker's own time on the request; their difference is the API, Redis and polling.

    python benchmarks/playground_latency.py                     # 200 warm, 30 cold, 5 sweeps
    python benchmarks/playground_latency.py --warm 50 --cold 10 --sweeps 0 --json figures.json
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import psycopg
import yaml
from harness import (
    FORK,
    BenchmarkError,
    Processes,
    latency_summary,
    opd,
    positive,
    postgres_database,
    progress,
    redis_queue,
    run_benchmark,
)
from seeding import SWEEP_METRIC, Trial, TrialWriter, release, seed_sweep, sweep_definition
from sqlalchemy import make_url
from support import free_port

from app.core.db import create_db_engine, session_factory
from app.jobs.schemas import JobStatus

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "What is 2 + 3?"
TEAM = "bench"
WRITER = "benchmark-writer"
BEAT_SECONDS = 1.0
"""The worker's heartbeat interval here (OPD_HEARTBEAT_INTERVAL); the writer's too."""
MISSED_AFTER = 2 * BEAT_SECONDS
"""A heartbeat is missed when none came for this long."""
TRIAL_METRICS = (SWEEP_METRIC, "trainer/loss_mean", "train/learning_rate", "time/step_elapsed_time")
TARGET_RATIO = 2.0


def training_spec(steps: int) -> dict[str, Any]:
    """examples/tiny.yaml, without its eval, saving sampler weights after every step."""
    spec = yaml.safe_load((ROOT / "examples" / "tiny.yaml").read_text())
    del spec["eval"]
    spec["loop"] |= {"steps": steps, "save_every": 1, "keep_samples": 0}
    spec["local"] = {"device": "cpu"}
    return spec


def wait_for(client: httpx.Client, job_id: int) -> None:
    deadline = time.monotonic() + 600
    while (job := client.get(f"/v1/jobs/{job_id}").json())["status"] not in {
        "succeeded",
        "failed",
        "cancelled",
    }:
        if time.monotonic() > deadline:
            raise BenchmarkError(f"the training job did not finish: {job}")
        time.sleep(0.5)
    if job["status"] != "succeeded":
        raise BenchmarkError(f"the training job ended {job['status']}: {job['error']}")


def timed(client: httpx.Client, job_id: int, body: dict[str, Any]) -> tuple[float, dict]:
    began = time.perf_counter()
    response = client.post(f"/v1/jobs/{job_id}/playground", json=body)
    seconds = time.perf_counter() - began
    if response.status_code != 200:
        raise BenchmarkError(f"a sample request failed: {response.status_code} {response.text}")
    return seconds, response.json()


def summary(pairs: list[tuple[float, dict]]) -> dict[str, Any]:
    return {
        "requests": len(pairs),
        "client": latency_summary([seconds for seconds, _ in pairs]),
        "worker": latency_summary([answer["seconds"] for _, answer in pairs]),
    }


def beating_spec() -> dict[str, Any]:
    """A long, light job the worker runs through both warm phases: its heartbeats."""
    spec = training_spec(100_000)
    spec["loop"] |= {"save_every": 0, "batch_size": 1, "group_size": 2}
    spec["sampling"] = {"max_tokens": 8}
    return spec


class Heartbeats:
    """The heartbeat timestamps of one job, polled from the database on a thread."""

    def __init__(self, url: str, job_id: int) -> None:
        self.url = psycopg_url(url)
        self.job_id = job_id
        self.seen: list[Any] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.watch, daemon=True)

    def watch(self) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            while not self.stop.wait(0.05):
                row = conn.execute(
                    "SELECT heartbeat_at FROM jobs WHERE id = %s", (self.job_id,)
                ).fetchone()
                if row and row[0] is not None and (not self.seen or row[0] != self.seen[-1]):
                    self.seen.append(row[0])

    def __enter__(self) -> Heartbeats:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join()

    def figures(self) -> dict[str, Any]:
        gaps = [(b - a).total_seconds() for a, b in zip(self.seen, self.seen[1:], strict=False)]
        return {
            "beats": len(self.seen),
            "max_gap_s": max(gaps, default=None),
            "missed": sum(gap > MISSED_AFTER for gap in gaps),
        }


def psycopg_url(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def count(url: str, query: str) -> int:
    """The one number a query answers."""
    with psycopg.connect(psycopg_url(url)) as conn:
        row = conn.execute(query).fetchone()
    return int(row[0]) if row else 0


def seed_one(
    url: str, team_id: int, index: int, trials: int, steps: int
) -> tuple[int, dict[int, Trial]]:
    """One sweep (ASHA from a twentieth of its steps, eta 3), trial n recorded up to a
    share n / trials of its steps, all running; a child process's work."""
    progress_of = {n: int((steps - 10) * n / trials) for n in range(1, trials + 1)}

    async def seed() -> tuple[int, dict[int, Trial]]:
        engine = create_db_engine(url)
        async with session_factory(engine)() as session:
            definition = sweep_definition(f"load-{index}", trials, steps, max(1, steps // 20))
            sweep_id, job_ids = await seed_sweep(
                session,
                team_id,
                definition,
                lambda n: (JobStatus.running, progress_of[n]),
                WRITER,
                TRIAL_METRICS,
            )
        await engine.dispose()
        return sweep_id, {
            job_id: Trial(n, progress_of[n], steps) for n, job_id in enumerate(job_ids, start=1)
        }

    return asyncio.run(seed())


def seed_sweeps(
    processes: Processes, url: str, args: argparse.Namespace
) -> tuple[list[int], dict[int, Trial]]:
    team_id = count(url, f"SELECT id FROM teams WHERE name = '{TEAM}'")
    children = [
        processes.call(f"seeder {i}", seed_one, url, team_id, i, args.trials, args.sweep_steps)
        for i in range(args.sweeps)
    ]
    sweeps, trials = [], {}
    for child in children:
        sweep_id, seeded = child.result()
        sweeps.append(sweep_id)
        trials |= seeded
    return sweeps, trials


def controlled(url: str, sweep_ids: list[int]) -> int:
    ids = ", ".join(map(str, sweep_ids))
    return count(
        url, f"SELECT count(*) FROM sweeps WHERE id IN ({ids}) AND lease_owner IS NOT NULL"
    )


def under_sweeps(
    processes: Processes,
    url: str,
    warm: Callable[[], list[tuple[float, dict]]],
    beating: int,
    args: argparse.Namespace,
) -> dict[str, Any]:
    """Seed the sweeps, hand them to the controller, and time warm requests meanwhile."""
    progress(f"seeding {args.sweeps} sweeps of {args.trials} trials x {args.sweep_steps:,} steps")
    sweeps, trials = seed_sweeps(processes, url, args)
    stop = FORK.Event()
    writer = TrialWriter(url, trials, WRITER, TRIAL_METRICS, args.steps_per_second, BEAT_SECONDS)
    writing = processes.call("trial writer", writer.write, stop)
    asyncio.run(release_all(url, sweeps))
    deadline = time.monotonic() + 60
    while controlled(url, sweeps) < len(sweeps):
        if time.monotonic() > deadline:
            raise BenchmarkError("the worker's controller did not take the sweeps")
        time.sleep(0.2)
    judged_before = count(url, "SELECT count(*) FROM sweep_rungs")
    progress(f"warm: {args.warm} requests while the worker controls them")
    with Heartbeats(url, beating) as beats:
        timed_warm = warm()
    judged = count(url, "SELECT count(*) FROM sweep_rungs") - judged_before
    stop.set()
    return {
        **summary(timed_warm),
        "heartbeats": beats.figures(),
        "judgments_meanwhile": judged,
        "judgments_before": judged_before,
        **writing.result(),
    }


async def release_all(url: str, sweeps: list[int]) -> None:
    engine = create_db_engine(url)
    async with session_factory(engine)() as session:
        await release(session, sweeps)
    await engine.dispose()


def benchmark(args: argparse.Namespace) -> dict[str, Any]:
    with (
        tempfile.TemporaryDirectory(prefix="opd-playground-bench-") as folder,
        redis_queue(args.redis_url) as queue,
        postgres_database() as url,
    ):
        home = Path(folder)
        env = os.environ | {
            "PYTHONPATH": str(ROOT),
            "OPD_HOME": str(home),
            "OPD_DATABASE_URL": url,
            "OPD_REDIS_URL": args.redis_url,
            "OPD_QUEUE_NAME": queue,
            "OPD_SAMPLER_CACHE_ENTRIES": "2",
            "OPD_HEARTBEAT_INTERVAL": str(BEAT_SECONDS),
            "TORCHINDUCTOR_CACHE_DIR": str(home / "torchinductor"),  # torch's, in $TMPDIR
        }
        processes = Processes(home)
        try:
            opd(env, "migrate")
            key = opd(env, "keys", "create", "--team", TEAM)
            url_api = f"http://127.0.0.1:{free_port()}"
            port = url_api.rsplit(":", 1)[1]
            api = processes.command(
                "api", [sys.executable, "-m", "opd.cli", "api", "--port", port, "--quiet"], env
            )
            api.wait_until_serving(f"{url_api}/healthz")
            processes.command("worker", [sys.executable, "-m", "opd.cli", "worker"], env)
            client = httpx.Client(
                base_url=url_api, headers={"Authorization": f"Bearer {key}"}, timeout=120
            )
            progress(f"training a tiny job that saves {args.cold + 1} sampler weights")
            job = client.post("/v1/jobs", json=training_spec(args.cold + 1)).json()
            wait_for(client, job["id"])
            beating = client.post("/v1/jobs", json=beating_spec()).json()["id"]
            body = {"prompt": PROMPT, "max_tokens": args.max_tokens, "compare": ["teacher"]}
            first = timed(client, job["id"], body)

            def warm() -> list[tuple[float, dict]]:
                timed(client, job["id"], body)  # loads what a cold request evicted
                answers = [timed(client, job["id"], body) for _ in range(args.warm)]
                if not all(o["cached"] for _, answer in answers for o in answer["outputs"]):
                    raise BenchmarkError("a warm request found a model unloaded")
                return answers

            wait_until_running(client, beating)
            progress(f"warm: {args.warm} requests for the final weights")
            with Heartbeats(url, beating) as idle_beats:
                idle = warm()
            progress(f"cold: {args.cold} requests, each for weights not loaded")
            cold = [
                timed(client, job["id"], body | {"checkpoint": step})
                for step in range(1, args.cold + 1)
            ]
            if any(answer["outputs"][0]["cached"] for _, answer in cold):
                raise BenchmarkError("a cold request found its weights loaded")
            result = {
                "max_tokens": args.max_tokens,
                "first_after_start": summary([first]),
                "warm": summary(idle) | {"heartbeats": idle_beats.figures()},
                "cold": summary(cold),
            }
            if args.sweeps:
                result["sweeps"] = {
                    "sweeps": args.sweeps,
                    "trials": args.trials,
                    "steps": args.sweep_steps,
                    "warm": under_sweeps(processes, url, warm, beating, args),
                }
            client.post(f"/v1/jobs/{beating}/cancel")
            return result
        finally:
            processes.close()


def wait_until_running(client: httpx.Client, job_id: int) -> None:
    deadline = time.monotonic() + 600
    while client.get(f"/v1/jobs/{job_id}").json()["status"] != "running":
        if time.monotonic() > deadline:
            raise BenchmarkError(f"job {job_id} did not start")
        time.sleep(0.2)


def line(name: str, figures: dict[str, Any]) -> str:
    client, worker = figures["client"], figures["worker"]
    return (
        f"{name:<18} n={figures['requests']:<4} "
        f"p50 {client['p50_ms']:.1f} ms, p99 {client['p99_ms']:.1f} ms "
        f"(worker p50 {worker['p50_ms']:.1f} ms, p99 {worker['p99_ms']:.1f} ms)"
    )


def beats(figures: dict[str, Any]) -> str:
    gap = figures["max_gap_s"]
    return f"{figures['beats']} beats, longest gap {'-' if gap is None else f'{gap:.2f} s'}"


def report(result: dict[str, Any]) -> str:
    lines = [
        f"POST /v1/jobs/{{id}}/playground on the tiny models, {result['max_tokens']} tokens, "
        "compared with the teacher (client wall time; the worker's own time in brackets)"
    ]
    for name in ("warm", "cold", "first_after_start"):
        lines.append(line(name.replace("_", " "), result[name]))
    if "sweeps" not in result:
        return "\n".join(lines)
    sweeps, idle = result["sweeps"], result["warm"]
    loaded = sweeps["warm"]
    ratio = loaded["client"]["p99_ms"] / idle["client"]["p99_ms"]
    missed = idle["heartbeats"]["missed"] + loaded["heartbeats"]["missed"]
    lines += [
        f"while the worker controls {sweeps['sweeps']} sweeps of {sweeps['trials']} trials x "
        f"{sweeps['steps']:,} steps ({loaded['judgments_before']:,} judgments before, "
        f"{loaded['judgments_meanwhile']:,} meanwhile; the writer recorded "
        f"{loaded['steps_written']:,} steps, {loaded['trials_stopped']} trials stopped):",
        line("warm, sweeps", loaded),
        f"heartbeats every {BEAT_SECONDS:g} s: idle {beats(idle['heartbeats'])}; "
        f"with sweeps {beats(loaded['heartbeats'])}; missed (none for {MISSED_AFTER:g} s): "
        f"{missed}",
        f"p99 with sweeps / idle: {ratio:.2f}x; target <= {TARGET_RATIO:g}x and no heartbeat "
        f"missed: {'met' if ratio <= TARGET_RATIO and not missed else 'NOT met'}",
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--warm", type=positive(int), default=200, help="warm requests")
    parser.add_argument("--cold", type=positive(int), default=30, help="cold requests")
    parser.add_argument("--max-tokens", type=positive(int), default=32)
    parser.add_argument("--sweeps", type=int, default=5, help="sweeps controlled (0: none)")
    parser.add_argument("--trials", type=positive(int), default=100, help="trials per sweep")
    parser.add_argument("--sweep-steps", type=positive(int), default=2000, help="per trial")
    parser.add_argument(
        "--steps-per-second", type=positive(float), default=50.0, help="the trials' writer's"
    )
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/13")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    return run_benchmark(benchmark, report, parser.parse_args())


if __name__ == "__main__":
    sys.exit(main())
