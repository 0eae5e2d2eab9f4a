"""The playground's latency on the tiny models: `POST /v1/jobs/{id}/sample`, answered by a
real `opd worker` through Redis, from a client on the loopback.

Trains a tiny job that saves sampler weights after every step, then measures
1. warm: the final weights and the teacher already loaded in the worker's cache, the same
   request again and again (`--warm` times, after one untimed warm-up);
2. cold: each request asks for weights the worker has not loaded (a step not asked before,
   `--cold` of them; the cache holds 2 samplers, so none is kept for long), so the worker
   loads the base model and merges that step's LoRA into it; the teacher stays loaded;
3. the first request after the worker started (it also connects the backend and loads the
   teacher).
Each request completes one prompt with `--max-tokens` tokens, compared with the teacher
(its scores and the reverse KL included). Figures are the client's wall time, and the
worker's own time on the request; their difference is the API, Redis and polling.

    python benchmarks/playground_latency.py                     # 200 warm, 30 cold
    python benchmarks/playground_latency.py --warm 50 --cold 10 --json figures.json
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import yaml
from harness import (
    BenchmarkError,
    Processes,
    latency_summary,
    positive,
    progress,
    redis_queue,
    run_benchmark,
)
from support import free_port

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "What is 2 + 3?"


def training_spec(steps: int) -> dict[str, Any]:
    """examples/tiny.yaml, without its eval, saving sampler weights after every step."""
    spec = yaml.safe_load((ROOT / "examples" / "tiny.yaml").read_text())
    del spec["eval"]
    spec["loop"] |= {"steps": steps, "save_every": 1, "keep_samples": 0}
    spec["local"] = {"device": "cpu"}
    return spec


def opd(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "opd.cli", *args], env=env, capture_output=True, text=True
    )
    if done.returncode:
        raise BenchmarkError(f"opd {' '.join(args)} failed: {done.stderr[-2000:]}")
    return done.stdout.strip()


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
    response = client.post(f"/v1/jobs/{job_id}/sample", json=body)
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


def benchmark(args: argparse.Namespace) -> dict[str, Any]:
    with (
        tempfile.TemporaryDirectory(prefix="opd-playground-bench-") as folder,
        redis_queue(args.redis_url) as queue,
    ):
        home = Path(folder)
        env = os.environ | {
            "PYTHONPATH": str(ROOT),
            "OPD_HOME": str(home),
            "OPD_REDIS_URL": args.redis_url,
            "OPD_QUEUE_NAME": queue,
            "OPD_SAMPLER_CACHE_ENTRIES": "2",
            "TORCHINDUCTOR_CACHE_DIR": str(home / "torchinductor"),  # torch's, in $TMPDIR
        }
        processes = Processes(home)
        try:
            opd(env, "migrate")
            key = opd(env, "keys", "create", "--team", "bench")
            url = f"http://127.0.0.1:{free_port()}"
            port = url.rsplit(":", 1)[1]
            api = processes.command(
                "api", [sys.executable, "-m", "opd.cli", "api", "--port", port, "--quiet"], env
            )
            api.wait_until_serving(f"{url}/healthz")
            processes.command("worker", [sys.executable, "-m", "opd.cli", "worker"], env)
            client = httpx.Client(
                base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=120
            )
            progress(f"training a tiny job that saves {args.cold + 1} sampler weights")
            job = client.post("/v1/jobs", json=training_spec(args.cold + 1)).json()
            wait_for(client, job["id"])
            body = {"prompt": PROMPT, "max_tokens": args.max_tokens, "compare": ["teacher"]}
            first = timed(client, job["id"], body)
            progress(f"warm: {args.warm} requests for the final weights")
            warm = [timed(client, job["id"], body) for _ in range(args.warm)]
            if not all(o["cached"] for _, answer in warm for o in answer["outputs"]):
                raise BenchmarkError("a warm request found a model unloaded")
            progress(f"cold: {args.cold} requests, each for weights not loaded")
            cold = [
                timed(client, job["id"], body | {"checkpoint": step})
                for step in range(1, args.cold + 1)
            ]
            if any(answer["outputs"][0]["cached"] for _, answer in cold):
                raise BenchmarkError("a cold request found its weights loaded")
            return {
                "max_tokens": args.max_tokens,
                "first_after_start": summary([first]),
                "warm": summary(warm),
                "cold": summary(cold),
            }
        finally:
            processes.close()


def report(result: dict[str, Any]) -> str:
    lines = [
        f"POST /v1/jobs/{{id}}/sample on the tiny models, {result['max_tokens']} tokens, "
        "compared with the teacher (client wall time; the worker's own time in brackets)"
    ]
    for name in ("warm", "cold", "first_after_start"):
        figures = result[name]
        client, worker = figures["client"], figures["worker"]
        lines.append(
            f"{name.replace('_', ' '):<18} n={figures['requests']:<4} "
            f"p50 {client['p50_ms']:.1f} ms, p99 {client['p99_ms']:.1f} ms "
            f"(worker p50 {worker['p50_ms']:.1f} ms, p99 {worker['p99_ms']:.1f} ms)"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--warm", type=positive(int), default=200, help="warm requests")
    parser.add_argument("--cold", type=positive(int), default=30, help="cold requests")
    parser.add_argument("--max-tokens", type=positive(int), default=32)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/13")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    return run_benchmark(benchmark, report, parser.parse_args())


if __name__ == "__main__":
    sys.exit(main())
