"""How fast the OPD loop steps against a remote engine, on policy and pipelined, side by side.

    python benchmarks/loop_speed.py [--steps 20] [--refresh 0.1] [--sample 0.2]
                                    [--teacher 0.05] [--forward-backward 0.15] [--optim 0.02]
                                    [--cpu-steps 5] [--cpu-rollouts 64] [--cpu-tokens 4096]
                                    [--realistic-step 30] [--json out.json]

The real loop (`run_loop`, through the `resilient` proxy the worker uses) runs against the
PyTRIO fake (tests/fakes/trio.py) made to answer like a remote engine: the trainer serves
one call at a time, each taking its latency (sampler refresh, forward_backward,
optim_step), while sampling and teacher scoring calls run concurrently, each taking its
own. The fake's own work is done inside those latencies. Completions are exactly
`--tokens` long (512). It prints, in one run: the on-policy step against its lower bound
(the sum of the five latencies), the k = 1 and k = 2 steps against the on-policy step and
their staleness, and the loop's own CPU time per step at zero latency for 64 x 4,096-token
rollouts against a realistic remote step (`--realistic-step`). See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from collections.abc import Awaitable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

# The PyTRIO fake lives with the tests.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pytrio.types import (
    AdamParams,
    Datum,
    ModelInput,
    SampleResponse,
    SampleSequence,
    SamplingParams,
)

from kernel.spec import JobSpec
from tests.fakes import model
from tests.fakes.trio import (
    FakeSamplingClient,
    FakeServiceClient,
    FakeTrainingClient,
    validated_request,
)
from worker.engine.backends.resilient import resilient
from worker.engine.backends.trio import ERRORS
from worker.engine.data.prompts import Prompts
from worker.engine.loop.steps import run_loop
from worker.engine.tracking.sinks import Sink

T = TypeVar("T")
QUESTIONS = [
    "What is the sum of the first 100 positive integers?",
    "How many primes are there below 50?",
    "Solve for x: 3x + 7 = 22.",
    "What is the area of a circle of radius 3?",
]
PRINTABLE = (33, 127)  # tokens the sampler draws: printable bytes, never a stop token


@dataclass(frozen=True)
class Latencies:
    refresh: float
    sample: float
    teacher: float
    forward_backward: float
    optim: float

    def bound(self) -> float:
        """The on-policy step can be no shorter: each phase waits for the one before."""
        return self.refresh + self.sample + self.teacher + self.forward_backward + self.optim


@dataclass
class Engine:
    """What the remote engine shares: its latencies, its trainer's queue, and the CPU time
    the fake spent computing (the engine's work, not the loop's)."""

    latencies: Latencies
    trainer_free_at: float = 0.0
    fake_cpu: float = 0.0

    def trainer_done_at(self, latency: float) -> float:
        """The trainer serves one call at a time, in the order they were sent."""
        now = asyncio.get_running_loop().time()
        self.trainer_free_at = max(now, self.trainer_free_at) + latency
        return self.trainer_free_at

    async def computed(self, work: Awaitable[T]) -> T:
        started = time.thread_time()
        try:
            return await work
        finally:
            self.fake_cpu += time.thread_time() - started

    async def answer(self, latency: float, work: Awaitable[T]) -> T:
        """`work`'s result `latency` seconds after the call. The requests made together
        are all sent before any is computed, as they would reach a remote engine."""
        deadline = asyncio.get_running_loop().time() + latency
        await asyncio.sleep(0)
        result = await self.computed(work)
        await sleep_until(deadline)
        return result


async def sleep_until(deadline: float) -> None:
    await asyncio.sleep(max(0.0, deadline - asyncio.get_running_loop().time()))


async def answered_at(deadline: float, result: Awaitable[T]) -> T:
    await sleep_until(deadline)
    return await result


class RemoteSampler:
    """The fake's sampler with a remote sampler's latency; completions of exactly
    max_tokens printable tokens, drawn and scored with whole-array numpy."""

    def __init__(self, fake: FakeSamplingClient, engine: Engine) -> None:
        self.fake, self.engine = fake, engine

    def get_tokenizer(self) -> Any:
        return self.fake.get_tokenizer()

    async def sample_async(
        self,
        prompt: ModelInput,
        num_samples: int = 1,
        sampling_params: SamplingParams = SamplingParams(),  # noqa: B008 - immutable default
        include_prompt_logprobs: bool = False,
        topk_prompt_logprobs: int = 0,
        return_text: bool = True,
    ) -> SampleResponse:
        latency = self.engine.latencies.sample
        return await self.engine.answer(latency, self.draw(prompt, num_samples, sampling_params))

    async def draw(self, prompt: ModelInput, n: int, params: SamplingParams) -> SampleResponse:
        validated_request(prompt, n, params, False, 0, False)
        tokens = prompt.to_ints()
        rng = model.rng_for("sample", self.fake.weights, params.seed or 0, *tokens)
        drawn = rng.integers(*PRINTABLE, size=(n, params.max_tokens or 1))
        previous = np.concatenate([np.full((n, 1), tokens[-1]), drawn[:, :-1]], axis=1)
        logprobs = model.log_probs(self.fake.weights)[previous, drawn]
        return SampleResponse(
            sequences=[
                SampleSequence(stop_reason="length", tokens=row.tolist(), logprobs=lps.tolist())
                for row, lps in zip(drawn, logprobs, strict=True)
            ]
        )

    async def compute_logprobs_async(self, prompt: ModelInput) -> list[float | None]:
        return await self.engine.answer(self.engine.latencies.teacher, self.score(prompt))

    async def score(self, prompt: ModelInput) -> list[float | None]:
        tokens = np.asarray(prompt.to_ints())
        return [None, *model.log_probs(self.fake.weights)[tokens[:-1], tokens[1:]].tolist()]


class RemoteTrainer:
    """The fake's training client behind a remote trainer's queue."""

    sampler_type: type = RemoteSampler
    """What wraps the samplers it makes (benchmarks/learning.py serves real models)."""

    def __init__(self, fake: FakeTrainingClient, engine: Engine) -> None:
        self.fake, self.engine = fake, engine

    def get_tokenizer(self) -> Any:
        return self.fake.get_tokenizer()

    async def forward_backward_async(
        self,
        data: list[Datum],
        loss_fn: str = "cross_entropy",
        loss_fn_config: dict[str, float] | None = None,
    ) -> Awaitable[Any]:
        done = self.engine.trainer_done_at(self.engine.latencies.forward_backward)
        future = await self.engine.computed(
            self.fake.forward_backward_async(data, loss_fn, loss_fn_config)
        )
        return answered_at(done, future)

    async def optim_step_async(self, adam_params: AdamParams) -> Awaitable[Any]:
        done = self.engine.trainer_done_at(self.engine.latencies.optim)
        future = await self.engine.computed(self.fake.optim_step_async(adam_params))
        return answered_at(done, future)

    async def save_state_async(self, name: str) -> Awaitable[Any]:
        return await self.engine.computed(self.fake.save_state_async(name))

    async def save_weights_for_sampler_async(self, name: str) -> Awaitable[Any]:
        return await self.engine.computed(self.fake.save_weights_for_sampler_async(name))

    async def save_weights_and_get_sampling_client_async(self) -> RemoteSampler:
        done = self.engine.trainer_done_at(self.engine.latencies.refresh)
        sampler = await self.engine.computed(self.fake.save_weights_and_get_sampling_client_async())
        await sleep_until(done)
        return self.sampler_type(sampler, self.engine)

    async def create_sampling_client_async(self, model_path: str) -> RemoteSampler:
        sampler = await self.fake.create_sampling_client_async(model_path)
        return self.sampler_type(sampler, self.engine)


class RemoteService:
    def __init__(self, engine: Engine) -> None:
        self.fake, self.engine = FakeServiceClient(), engine

    async def create_lora_training_client_async(
        self, base_model: str, rank: int = 32, seed: int | None = None
    ) -> RemoteTrainer:
        training = await self.fake.create_lora_training_client_async(base_model, rank, seed)
        return RemoteTrainer(training, self.engine)

    async def create_sampling_client_async(
        self, base_model: str, model_path: str | None = None
    ) -> RemoteSampler:
        sampler = await self.fake.create_sampling_client_async(base_model, model_path)
        return RemoteSampler(sampler, self.engine)


@dataclass
class StepClock(Sink):
    """When each step ended, in wall time and in the loop thread's CPU time."""

    engine: Engine
    ends: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    metrics: list[dict[str, float]] = field(default_factory=list)

    def step(self, step: int, metrics: dict[str, float]) -> None:
        self.ends.append(time.perf_counter())
        self.cpu.append(time.thread_time() - self.engine.fake_cpu)
        self.metrics.append(metrics)


def job_spec(k: int, steps: int, batch: int, group: int, tokens: int) -> JobSpec:
    return JobSpec.model_validate(
        {
            "name": "loop-speed",
            "backend": "trio",
            "student": {"base_model": "student/model", "lora_rank": 32},
            "teacher": {"base_model": "teacher/model"},
            "dataset": {"source": "inline", "prompts": QUESTIONS},
            "sampling": {"max_tokens": tokens},
            "loop": {
                "steps": steps,
                "batch_size": batch,
                "group_size": group,
                "max_steps_off_policy": k,
            },
        }
    )


async def run(spec: JobSpec, latencies: Latencies) -> StepClock:
    engine = Engine(latencies)
    service = resilient(RemoteService(engine), ERRORS, lambda *_: None)  # type: ignore[arg-type]
    clock = StepClock(engine)
    await run_loop(spec, service, Prompts(QUESTIONS, [None] * len(QUESTIONS)), clock)
    return clock


@dataclass(frozen=True)
class Speed:
    k: int
    median_step: float
    staleness_mean: float
    staleness_max: float
    rollout_wait: float


def speed(k: int, clock: StepClock) -> Speed:
    """Medians over the steps after the first k + 1 (which fill the pipeline)."""
    settled = slice(k + 1, None)
    gaps = np.diff(clock.ends)[k:]
    measured = clock.metrics[settled]
    return Speed(
        k=k,
        median_step=float(statistics.median(gaps)),
        staleness_mean=float(np.mean([m["train/staleness_mean"] for m in measured])),
        staleness_max=max(m["train/staleness_max"] for m in measured),
        rollout_wait=float(statistics.median(m["time/rollout_wait"] for m in measured)),
    )


def loop_cpu_per_step(clock: StepClock) -> float:
    """The loop thread's CPU per step, less what the fake computed, after the first step."""
    return float(statistics.median(np.diff(clock.cpu)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--refresh", type=float, default=0.1)
    parser.add_argument("--sample", type=float, default=0.2)
    parser.add_argument("--teacher", type=float, default=0.05)
    parser.add_argument("--forward-backward", type=float, default=0.15)
    parser.add_argument("--optim", type=float, default=0.02)
    parser.add_argument("--cpu-steps", type=int, default=5)
    parser.add_argument("--cpu-rollouts", type=int, default=64, help="a multiple of 4")
    parser.add_argument("--cpu-tokens", type=int, default=4096)
    parser.add_argument("--realistic-step", type=float, default=30.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    latencies = Latencies(
        args.refresh, args.sample, args.teacher, args.forward_backward, args.optim
    )
    bound = latencies.bound()
    load = os.getloadavg()[0]
    print(
        f"loop speed: the real loop against the PyTRIO fake, batch {args.batch} x group "
        f"{args.group}, {args.tokens}-token completions, {args.steps} steps; latencies: "
        f"refresh {args.refresh} s, sample {args.sample} s, teacher {args.teacher} s, "
        f"forward_backward {args.forward_backward} s, optim_step {args.optim} s; "
        f"load average {load:.2f}"
    )
    speeds = [
        speed(
            k,
            asyncio.run(
                run(job_spec(k, args.steps, args.batch, args.group, args.tokens), latencies)
            ),
        )
        for k in (0, 1, 2)
    ]
    on_policy = speeds[0].median_step
    print(
        f"{'max_steps_off_policy':<22}{'median step':>12}{'vs bound':>10}{'speedup':>9}"
        f"{'staleness mean/max':>20}{'rollout wait':>14}"
    )
    for s in speeds:
        print(
            f"{s.k:<22}{s.median_step:>10.3f} s{s.median_step / bound:>9.2f}x"
            f"{on_policy / s.median_step:>8.2f}x{s.staleness_mean:>14.2f} / {s.staleness_max:<3g}"
            f"{s.rollout_wait:>12.3f} s"
        )

    zero = Latencies(0.0, 0.0, 0.0, 0.0, 0.0)
    cpu_spec = job_spec(0, args.cpu_steps, args.cpu_rollouts // 4, 4, args.cpu_tokens)
    cpu = loop_cpu_per_step(asyncio.run(run(cpu_spec, zero)))
    share = cpu / args.realistic_step
    print(
        f"loop CPU per step at zero latency, {args.cpu_rollouts} x {args.cpu_tokens}-token "
        f"rollouts: {cpu * 1000:.0f} ms = {share:.2%} of a {args.realistic_step:g} s step"
    )
    checks = {
        "on-policy step <= 1.05x the bound": on_policy / bound <= 1.05,
        "k = 1 at least 1.45x faster than k = 0": on_policy / speeds[1].median_step >= 1.45,
        "loop CPU under 2% of a realistic step": share < 0.02,
    }
    print(
        "targets: "
        + "; ".join(f"{name}: {'met' if ok else 'MISSED'}" for name, ok in checks.items())
    )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "latencies": asdict(latencies),
                    "bound_seconds": bound,
                    "speeds": [asdict(s) for s in speeds],
                    "loop_cpu_seconds_per_step": cpu,
                    "realistic_step_seconds": args.realistic_step,
                    "targets": checks,
                    "load_average_at_start": load,
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
