"""The student's rollouts on each engine, side by side in one run: the local backend's own
decoding loop, vLLM (`sampling.engine: vllm`), and transformers' `generate` as the anchor.

    python benchmarks/rollout_engines.py [--rollouts 32] [--tokens 64] [--prompts 4]
                                         [--versions 3] [--jobs 4] [--max-lora-rank 8]
                                         [--url http://127.0.0.1:8001/v1] [--json out.json]

SmolLM2-135M-Instruct (the `smollm2` extra; converted once into OPD_MODEL_CACHE, else
~/.cache/opd/models) with a fresh rank-4 LoRA, `--prompts` questions sampled `--rollouts /
--prompts` times each at temperature 1, at most `--tokens` tokens, each token's logprob
kept (what the loop needs), for `--versions` sampler versions in a row, as a job's sampler
refreshes: each version's weights saved and, on vLLM, its adapter loaded into the server
(`--url`, else a server `opd vllm serve --max-lora-rank` starts here, not timed) and the
one before unloaded, all of it counted in the engine's time. Each engine's tokens per
second are its sampled tokens over its wall time; the ratios are against the local engine.
`vllm_base` samples the base model on the same server without an adapter: what LoRA costs.
With `--jobs N` (N > 1), N jobs of the same base sample at once on each engine, each with
an adapter of its own: `local_jobs` on one worker (N slots, a backend each), `vllm_jobs` on
the one server. Each job's adapter is drawn from its seed, and vLLM's logprobs of the first
rollouts of each job's last version are checked against that job's own weights scoring the
same tokens (`logprob_diff_max`): the adapters sampled side by side are not mixed up. The
local engine and `generate` run on one torch thread, as vLLM's CPU build does on two cores
(it keeps the other for its scheduler). Figures: docs/how-to/vllm.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from pytrio.types import ModelInput, SamplingParams

from kernel.model_names import SMOLLM2
from kernel.spec import LocalBackendSpec
from opd.serve import free_port
from opd.vllm_server import VLLMSetupError, ensure_environment, environment, wait_ready
from worker.engine.backends.local import LocalServiceClient
from worker.engine.backends.local.gguf import default_model_cache
from worker.engine.backends.local.models import ModelCache, located
from worker.engine.backends.vllm import VLLMSampler, VLLMServer
from worker.engine.data.prompts import build_prompt
from worker.engine.rollouts.sampling import stop_sequences

CHECKED = 8
"""The rollouts of each job whose vLLM logprobs are checked against its own weights."""
QUESTIONS = ["What is 7 + 8?", "Name a prime above 20.", "What is 12 * 3?", "Spell 'cat'."]


def rendered(tokenizer: Any, count: int) -> list[list[int]]:
    return [build_prompt(tokenizer, QUESTIONS[i % len(QUESTIONS)], "", False) for i in range(count)]


Sampled = list[tuple[list[int], Any]]
"""Each rollout with its prompt: (prompt tokens, the sequence sampled)."""


async def sample_all(sampler: Any, prompts: list[list[int]], each: int, params: Any) -> Sampled:
    """Every prompt's rollouts at once."""
    answers = await asyncio.gather(
        *(
            sampler.sample_async(ModelInput.from_ints(p), each, params, return_text=False)
            for p in prompts
        )
    )
    return [
        (p, seq) for p, answer in zip(prompts, answers, strict=True) for seq in answer.sequences
    ]


class Job:
    """One job's student: its own backend (a worker's slot) and rank-4 adapter, its LoRA B
    drawn from the job's seed (a fresh adapter's B is zero: every job's would be the base,
    and a server mixing adapters up would go unseen)."""

    def __init__(self, work: Path, seed: int) -> None:
        self.service = LocalServiceClient(
            LocalBackendSpec(device="cpu"), work / f"job-{seed}", default_model_cache()
        )
        self.seed = seed

    async def open(self) -> Job:
        self.training = await self.service.create_lora_training_client_async(
            SMOLLM2, rank=4, seed=self.seed
        )
        drawn = torch.Generator().manual_seed(self.seed)
        with torch.no_grad():
            for name, weight in self.training.model.named_parameters():
                if "lora_B" in name:
                    weight.copy_(0.02 * torch.randn(weight.shape, generator=drawn))
        self.sampled: Sampled = []
        return self

    async def local(self, prompts: list[list[int]], each: int, params: Any, versions: int) -> int:
        """Each version's rollouts from the local engine: its weights saved, then sampled."""
        tokens = 0
        for _ in range(versions):
            sampler = await self.training.save_weights_and_get_sampling_client_async()
            tokens += count(await sample_all(sampler, prompts, each, params))
        return tokens

    async def vllm(
        self, server: VLLMServer, prompts: list[list[int]], each: int, params: Any, versions: int
    ) -> int:
        """Each version's rollouts on vLLM, as a job samples them: the adapter saved, loaded
        (the version before unloaded), then sampled."""
        tokens = 0
        for version in range(versions):
            name = f"bench-{self.seed}-vllm-{version:06d}"
            saved = await (await self.training.save_weights_for_sampler_async(name))
            loaded = await server.load(version, saved.path, set())
            sampler = VLLMSampler(server, loaded, self.training.get_tokenizer())
            self.sampled = await sample_all(sampler, prompts, each, params)
            tokens += count(self.sampled)
        return tokens

    async def logprob_difference(self, rollouts: int) -> float:
        """How far the logprobs vLLM gave the last version's first `rollouts` rollouts are
        from this job's own weights scoring the same tokens: the importance ratio's
        premise, checked with other jobs' adapters sampled beside them."""
        local = await self.training.save_weights_and_get_sampling_client_async()
        worst = 0.0
        for prompt, seq in self.sampled[:rollouts]:
            scored = await local.compute_logprobs_async(ModelInput.from_ints(prompt + seq.tokens))
            mine = scored[len(prompt) :]
            worst = max([worst, *(abs(a - b) for a, b in zip(mine, seq.logprobs, strict=True))])
        return worst


def count(sampled: Sampled) -> int:
    return sum(len(seq.tokens) for _, seq in sampled)


async def counted(sampling: Any) -> int:
    return count(await sampling)


async def timed(work: Any) -> dict[str, float]:
    started = time.perf_counter()
    tokens = sum(await asyncio.gather(*work))
    return {"tokens": tokens, "seconds": time.perf_counter() - started}


async def engines(args: argparse.Namespace, url: str) -> dict[str, dict[str, float]]:
    torch.set_num_threads(1)
    work = Path(args.work)
    jobs = [await Job(work, seed).open() for seed in range(1, max(args.jobs, 1) + 1)]
    first = jobs[0]
    tokenizer = first.training.get_tokenizer()
    prompts = rendered(tokenizer, args.prompts)
    each = args.rollouts // args.prompts
    params = SamplingParams(
        max_tokens=args.tokens, seed=1, temperature=1.0, stop=stop_sequences(tokenizer)
    )
    v = args.versions
    figures: dict[str, dict[str, float]] = {}
    figures["local"] = await timed([first.local(prompts, each, params, v)])
    servers = [VLLMServer(url, SMOLLM2, folder=work / f"server-{job.seed}") for job in jobs]
    try:
        figures["vllm"] = await timed([first.vllm(servers[0], prompts, each, params, v)])
        figures["vllm"]["logprob_diff_max"] = await first.logprob_difference(CHECKED)
        base = VLLMSampler(servers[0], SMOLLM2, tokenizer)  # what the adapter costs
        figures["vllm_base"] = await timed([counted(sample_all(base, prompts, each, params))])
        if args.jobs > 1:
            figures["local_jobs"] = await timed(
                [job.local(prompts, each, params, v) for job in jobs]
            )
            pairs = zip(jobs, servers, strict=True)
            figures["vllm_jobs"] = await timed(
                [job.vllm(server, prompts, each, params, v) for job, server in pairs]
            )
            differences = [await job.logprob_difference(CHECKED) for job in jobs]
            figures["vllm_jobs"]["logprob_diff_max"] = max(differences)
    finally:
        for server in servers:
            await server.aclose()

    figures["generate"] = generate(
        located(SMOLLM2, ModelCache(default_model_cache())), prompts, each, args
    )
    for figure in figures.values():
        figure["tokens_per_second"] = figure["tokens"] / figure["seconds"]
    for name, figure in figures.items():
        anchor = figures["local_jobs" if name.endswith("_jobs") else "local"]
        if figure is not anchor:
            figure["vs_local"] = figure["tokens_per_second"] / anchor["tokens_per_second"]
    return figures


def generate(folder: str, prompts: list[list[int]], each: int, args: Any) -> dict[str, float]:
    """transformers' `generate`, batched, left-padded, with each token's logprob."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    started = time.perf_counter()
    rows = [p for p in prompts for _ in range(each)]
    width = max(len(row) for row in rows)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    torch.manual_seed(1)
    with torch.no_grad():
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            max_new_tokens=args.tokens,
            output_logits=True,
            return_dict_in_generate=True,
            pad_token_id=pad,
        )
        model.compute_transition_scores(out.sequences, out.logits, normalize_logits=True)
    new = out.sequences[:, width:]
    ended = (new == tokenizer.eos_token_id).int().cumsum(dim=1)
    tokens = int(((ended == 0) | ((ended == 1) & (new == tokenizer.eos_token_id))).sum())
    return {"tokens": tokens, "seconds": time.perf_counter() - started}


def served(args: argparse.Namespace) -> tuple[str, subprocess.Popen[bytes] | None]:
    """`--url`, or a server `opd vllm serve` starts for this run."""
    if args.url:
        return args.url.rstrip("/"), None
    ensure_environment(environment(), lambda line: print(line, file=sys.stderr))
    port = free_port()
    serve = [
        "vllm",
        "serve",
        SMOLLM2,
        "--port",
        str(port),
        "--max-lora-rank",
        str(args.max_lora_rank),
    ]
    process = subprocess.Popen(
        [sys.executable, "-m", "opd.cli", *serve],
        env=os.environ | {"OPD_MODEL_CACHE": str(default_model_cache())},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    wait_ready(f"http://127.0.0.1:{port}", process, timeout=900)
    return f"http://127.0.0.1:{port}/v1", process


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--versions", type=int, default=3, help="sampler versions in a row")
    parser.add_argument("--jobs", type=int, default=1, help="jobs sampling at once (> 1)")
    parser.add_argument(
        "--max-lora-rank", type=int, default=8, help="the server started here (without --url)"
    )
    parser.add_argument("--url", help="a vLLM server of smollm2-135m-instruct (opd vllm serve)")
    parser.add_argument("--json", type=Path, help="write the figures here too")
    args = parser.parse_args()
    if args.rollouts < args.prompts or args.rollouts % args.prompts:
        parser.error("--rollouts must be a multiple of --prompts")
    try:
        url, process = served(args)
    except VLLMSetupError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    try:
        with tempfile.TemporaryDirectory(prefix="rollout-engines-") as work:
            args.work = work
            figures = asyncio.run(engines(args, url))
    finally:
        if process is not None:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=60)
    print(
        f"{args.rollouts} rollouts x <= {args.tokens} tokens of {SMOLLM2} for each of "
        f"{args.versions} sampler versions (the jobs: {args.jobs} at once), one run:"
    )
    for name, figure in figures.items():
        ratio = f", {figure['vs_local']:.2f}x the local engine" if "vs_local" in figure else ""
        if "logprob_diff_max" in figure:
            ratio += f"; logprobs within {figure['logprob_diff_max']:.1e} of the job's own"
        print(
            f"  {name:<10} {figure['tokens']:>5.0f} tokens in {figure['seconds']:6.1f} s: "
            f"{figure['tokens_per_second']:6.1f} tok/s{ratio}"
        )
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
