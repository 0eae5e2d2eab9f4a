"""Whether the local backend gains from the pipelined loop: k = 0, 1 and 2 side by side.

    python benchmarks/local_overlap.py [--steps 12] [--device cpu] [--hidden 256] [--layers 4]
                                       [--batch 4] [--group 4] [--tokens 64]

The local backend runs every model call (sampling, the teacher's scoring, training) on one
worker thread, so a pipelined loop can overlap only the loop's own work (datums, metrics,
the event loop) with the model's. This runs the real loop on the local backend for each k
and prints the median step, its completion tokens and the time per completion token (the
runs sample different completions, so their lengths differ; the comparison is per token).
`--hidden 0` uses the built-in tiny presets; `--hidden N` makes a random Qwen3 student and
teacher of that width (`--layers` deep, the presets' byte-level tokenizer) in a temporary
folder, whose completions nearly always run to `--tokens`: e.g. to measure on a GPU.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from kernel.spec import JobSpec
from worker.engine.backends import connect
from worker.engine.backends.local.presets import tiny_tokenizer
from worker.engine.data.prompts import Prompts
from worker.engine.loop.steps import run_loop
from worker.engine.tracking.sinks import Sink

QUESTIONS = ["What is 2 + 3?", "Compute 7 * 8.", "Is 17 a prime number?", "Solve x + 4 = 9."]


class StepEnds(Sink):
    def __init__(self) -> None:
        self.ends: list[float] = []
        self.waits: list[float] = []
        self.tokens: list[float] = []

    def step(self, step: int, metrics: dict[str, float]) -> None:
        self.ends.append(time.perf_counter())
        self.waits.append(metrics["time/rollout_wait"])
        self.tokens.append(metrics["data/completion_tokens_total"])


@dataclass(frozen=True)
class Speed:
    step: float
    tokens: float
    rollout_wait: float

    @property
    def per_token(self) -> float:
        return self.step / self.tokens


def random_model(folder: Path, hidden: int, layers: int, seed: int) -> str:
    """A random Qwen3 with the presets' tokenizer, saved as a Hugging Face folder."""
    tokenizer = tiny_tokenizer()
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=4 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 64,
        num_key_value_heads=max(hidden // 256, 1),
        head_dim=64,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(seed)
    Qwen3ForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def job_spec(k: int, args: argparse.Namespace, student: str, teacher: str) -> JobSpec:
    return JobSpec.model_validate(
        {
            "backend": "local",
            "student": {"base_model": student, "lora_rank": 16},
            "teacher": {"base_model": teacher},
            "dataset": {"source": "inline", "prompts": QUESTIONS, "question_suffix": ""},
            "sampling": {"max_tokens": args.tokens},
            "loop": {
                "steps": args.steps,
                "batch_size": args.batch,
                "group_size": args.group,
                "max_steps_off_policy": k,
            },
            "local": {"device": args.device},
        }
    )


async def speed(spec: JobSpec, artifacts: Path) -> Speed:
    """Medians after warm-up: time between step ends, completion tokens, rollout wait."""
    service = connect(spec, artifacts, lambda *_: None)
    ends = StepEnds()
    await run_loop(spec, service, Prompts(QUESTIONS, [None] * len(QUESTIONS)), ends)
    settled = spec.loop.max_steps_off_policy + 1
    return Speed(
        step=float(statistics.median(np.diff(ends.ends)[settled - 1 :])),
        tokens=float(statistics.median(ends.tokens[settled:])),
        rollout_wait=float(statistics.median(ends.waits[settled:])),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--hidden", type=int, default=256, help="0 = the tiny presets")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as temporary:
        folder = Path(temporary)
        student, teacher = "tiny-student", "tiny-teacher"
        if args.hidden:
            student = random_model(folder / "student", args.hidden, args.layers, seed=1)
            teacher = random_model(folder / "teacher", args.hidden, args.layers, seed=2)
        model = "tiny presets" if not args.hidden else f"random Qwen3 {args.hidden} x {args.layers}"
        print(
            f"local backend on {args.device}, {model}, batch {args.batch} x group {args.group}, "
            f"{args.tokens} tokens, {args.steps} steps; load average {os.getloadavg()[0]:.2f}"
        )
        print(
            f"{'max_steps_off_policy':<22}{'median step':>12}{'tokens':>8}"
            f"{'ms / token':>12}{'vs k = 0':>10}{'rollout wait':>14}"
        )
        on_policy: Speed | None = None
        for k in (0, 1, 2):
            run = asyncio.run(speed(job_spec(k, args, student, teacher), folder / f"run-{k}"))
            on_policy = on_policy or run
            print(
                f"{k:<22}{run.step:>10.3f} s{run.tokens:>8.0f}{run.per_token * 1000:>12.3f}"
                f"{on_policy.per_token / run.per_token:>9.2f}x{run.rollout_wait:>12.3f} s"
            )


if __name__ == "__main__":
    main()
