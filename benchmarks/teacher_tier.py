"""The teacher phase of a step on a teacher tier (OPD_TEACHER_REPLICAS) of 1, 2, ... replicas,
for one job and for several jobs at once, side by side in one run.

    python benchmarks/teacher_tier.py [--servers vllm|fake] [--replicas 1,2] [--jobs 1,4]
                                      [--steps 3] [--prompts 8] [--group 4]
                                      [--prompt-tokens 64] [--tokens 128] [--json out.json]

Each job scores a step's completions as the loop does (`--prompts` x `--group` sequences of
`--prompt-tokens` + `--tokens` token ids, through the service's own server-teacher client,
ServerTeacher, with its batching and concurrency defaults), `--steps` steps in a row; the jobs
of one run score at once, each with a client of its own, over the same tier. The figure is
the wall time of the teacher phase per step (all the jobs' scoring of one step), and its
scaling: the one-replica time over the tier's. Each replica's share of the requests comes
from the client's tally (`teacher/replica_share/<teacher>/<n>`).

`--servers vllm` starts the replicas with `opd vllm serve smollm2-135m-instruct --teacher`
(each its own process and port; not timed): SmolLM2-135M-Instruct as the teacher. `--servers fake`
serves each replica in process with a fixed cost per token scored (`--fake-ms-per-token`,
one request computing at a time per replica, as one accelerator's queue), which measures
the tier's routing where the server is the bottleneck, not a model. On a machine of two
CPU cores vLLM replicas share the cores, so they cannot scale there: the figures for vLLM
that mean something come from replicas on machines (or GPUs) of their own.
Figures: docs/how-to/teacher-server.md#a-teacher-tier.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pytrio.types import ModelInput

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kernel.spec import TeacherServer  # noqa: E402
from opd.serve import free_port  # noqa: E402
from opd.vllm_server import wait_ready  # noqa: E402
from tests.fakes.vllm_server import serving  # noqa: E402
from worker.engine.backends.server import ServerTeacher  # noqa: E402

SMOLLM2 = "smollm2-135m-instruct"
TIER = "http://teacher-tier.bench/v1"
"""The URL the jobs' specs write; the replicas stand behind it."""


class FakeReplica:
    """A completions server that scores one request at a time, `ms_per_token` a token."""

    def __init__(self, ms_per_token: float) -> None:
        self.seconds_per_token = ms_per_token / 1000
        self.computing = asyncio.Lock()

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.post("/v1/completions")
        async def completions(request: Request) -> JSONResponse:
            body = await request.json()
            prompts = body["prompt"] if isinstance(body["prompt"][0], list) else [body["prompt"]]
            async with self.computing:
                await asyncio.sleep(self.seconds_per_token * sum(map(len, prompts)))
            choices = [
                {
                    "index": i,
                    "text": "",
                    "logprobs": {
                        "token_logprobs": [None] + [-1.0] * (len(p) - 1),
                        "tokens": ["x"] * len(p),
                    },
                }
                for i, p in enumerate(prompts)
            ]
            return JSONResponse({"choices": choices})

        return app


def started_vllm(count: int, memory_fraction: float, stack: ExitStack) -> list[str]:
    """`count` replicas of SmolLM2 on vLLM, each `opd vllm serve` on a port of its own
    within `memory_fraction` of the machine's memory."""
    urls, processes = [], []
    for _ in range(count):
        port = free_port()
        command = [sys.executable, "-m", "opd.cli", "vllm", "serve", SMOLLM2, "--port", str(port)]
        command += ["--memory-fraction", str(memory_fraction), "--teacher"]
        process = subprocess.Popen(
            command,
            env=os.environ | {"PYTHONPATH": str(ROOT)},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        stack.callback(stop, process)
        urls.append(f"http://127.0.0.1:{port}")
        processes.append(process)
    for url, process in zip(urls, processes, strict=True):
        wait_ready(url, process, 900)
    return [f"{url}/v1" for url in urls]


def stop(process: subprocess.Popen[bytes]) -> None:
    os.killpg(process.pid, signal.SIGTERM)
    process.wait(timeout=60)


def step_sequences(args: argparse.Namespace, rng: np.random.Generator) -> list[list[int]]:
    """One step's sequences: each prompt's `group` completions after it, as token ids."""
    sequences = []
    for _ in range(args.prompts):
        prompt = rng.integers(100, 20_000, size=args.prompt_tokens).tolist()
        for _ in range(args.group):
            sequences.append(prompt + rng.integers(100, 20_000, size=args.tokens).tolist())
    return sequences


async def teacher_phase(
    args: argparse.Namespace, replicas: list[str], jobs: int, model: str
) -> dict[str, Any]:
    """`jobs` jobs scoring `--steps` steps each at once over `replicas`: the mean wall time
    of a step's teacher phase, and each replica's share of the requests."""
    options = TeacherServer(url=TIER, model=model, protocol="echo")
    clients = [ServerTeacher(options, None, replicas=replicas) for _ in range(jobs)]
    rng = np.random.default_rng(0)
    steps = [[step_sequences(args, rng) for _ in range(jobs)] for _ in range(args.steps + 1)]
    seconds = []
    try:
        for number, step in enumerate(steps):
            began = time.perf_counter()
            await asyncio.gather(
                *(
                    client.compute_logprobs_async(ModelInput.from_ints(tokens))
                    for client, sequences in zip(clients, step, strict=True)
                    for tokens in sequences
                )
            )
            if number:  # the first step warms the connections and the servers up
                seconds.append(time.perf_counter() - began)
            else:
                for client in clients:
                    client.tally()
        tallies = [client.tally() for client in clients]
    finally:
        for client in clients:
            await client.aclose()
    shares = np.mean([tally.shares for tally in tallies], axis=0)
    return {"seconds_per_step": float(np.mean(seconds)), "shares": [float(s) for s in shares]}


def counts(text: str) -> list[int]:
    return [int(part) for part in text.split(",")]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", choices=["vllm", "fake"], default="vllm")
    parser.add_argument("--replicas", type=counts, default=[1, 2], help="tier sizes, e.g. 1,2,4")
    parser.add_argument("--jobs", type=counts, default=[1, 4], help="jobs at once, e.g. 1,4")
    parser.add_argument("--steps", type=int, default=3, help="steps timed (after one warm-up)")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--fake-ms-per-token", type=float, default=0.05)
    parser.add_argument(
        "--vllm-memory-fraction",
        type=float,
        default=0.1,
        help="of the machine's memory each vLLM replica takes (weights and KV cache)",
    )
    parser.add_argument("--json", type=Path, help="write the figures here too")
    args = parser.parse_args()
    figures: dict[str, Any] = {}
    with ExitStack() as stack:
        if args.servers == "vllm":
            every = started_vllm(max(args.replicas), args.vllm_memory_fraction, stack)
            model = SMOLLM2
        else:
            every = [
                stack.enter_context(serving(FakeReplica(args.fake_ms_per_token)))
                for _ in range(max(args.replicas))
            ]
            model = "fake"
        for jobs in args.jobs:
            for count in args.replicas:
                figure = asyncio.run(teacher_phase(args, every[:count], jobs, model))
                figures[f"replicas={count} jobs={jobs}"] = figure | {
                    "replicas": count,
                    "jobs": jobs,
                }
    print(
        f"teacher phase per step: {args.prompts} prompts x {args.group} completions of "
        f"{args.prompt_tokens} + {args.tokens} tokens a job, {args.steps} steps, "
        f"{args.servers} servers, one run:"
    )
    for figure in figures.values():
        alone = figures[f"replicas={args.replicas[0]} jobs={figure['jobs']}"]
        figure["scaling"] = alone["seconds_per_step"] / figure["seconds_per_step"]
        shares = ", ".join(f"{share:.0%}" for share in figure["shares"])
        print(
            f"  {figure['jobs']} job(s), {figure['replicas']} replica(s): "
            f"{figure['seconds_per_step']:7.3f} s a step, {figure['scaling']:.2f}x "
            f"{args.replicas[0]} replica(s); shares {shares}"
        )
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
