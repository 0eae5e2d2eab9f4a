"""Peak memory and step time of each objective on the local backend, at a real vocabulary.

    python benchmarks/objective_memory.py [--vocab 151936] [--rows 8] [--completion 256]
                                          [--prompt 32] [--steps 3] [--device cpu]
                                          [--json out.json]

A random Qwen3 (2 layers, hidden 64) with Qwen3's vocabulary of 151,936 tokens is written
to a folder with a tokenizer of that size, then loaded by the local backend as a student
(LoRA rank 8) and as its teacher, as a job's models are. Each objective trains `--steps`
steps of `--rows` completions of `--completion` tokens in a process of its own, so its
peak resident memory (ru_maxrss) is its own. `direct` is the same full-vocabulary reverse
KL computed the obvious way, in one pass over [rows, length, vocabulary] logits (as TRL's
trainer computes it): the figure the chunked objectives are measured against. The table
gives each one's median step time and peak memory beside the reference objective's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

OBJECTIVES: dict[str, dict | str] = {
    "sampled_reverse_kl": "sampled_reverse_kl",
    "reverse_kl": "reverse_kl",
    "reverse_kl top-64": {"kind": "reverse_kl", "top_k": 64},
    "forward_kl": "forward_kl",
    "forward_kl top-64": {"kind": "forward_kl", "top_k": 64},
    "jsd": "jsd",
    "direct": "reverse_kl",
}


def write_model(folder: Path, vocab: int) -> None:
    """A random Qwen3 with `vocab` tokens and a word-level tokenizer of that many."""
    import torch
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        tie_word_embeddings=False,
    )
    Qwen3ForCausalLM(config).save_pretrained(folder)
    words = {f"t{i}": i for i in range(vocab)}
    tokenizer = Tokenizer(models.WordLevel(vocab=words, unk_token="t0"))
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="t0").save_pretrained(folder)


async def train(args: argparse.Namespace) -> dict[str, float]:
    """Run the steps of one objective; its step times and peak memory."""
    import numpy as np
    import torch
    from pytrio.types import AdamParams

    from kernel.spec import LocalBackendSpec, ObjectiveSpec
    from worker.engine.backends.local import LocalServiceClient
    from worker.engine.backends.local.divergences import divergence
    from worker.engine.rollouts.datums import build_opd_datum

    objective = ObjectiveSpec.model_validate(OBJECTIVES[args.child])
    service = LocalServiceClient(LocalBackendSpec(device=args.device), Path(args.model) / "runs")
    student = await service.create_lora_training_client_async(args.model, rank=8, seed=0)
    teacher = await service.create_sampling_client_async(args.model)
    rng = np.random.default_rng(0)
    rows = []
    for _ in range(args.rows):
        tokens = rng.integers(1, args.vocab, size=args.prompt + args.completion).tolist()
        prompt, completion = tokens[: args.prompt], tokens[args.prompt :]
        logprobs = rng.uniform(-12, -10, size=args.completion)
        advantages = rng.normal(size=args.completion)
        rows.append((prompt, completion, logprobs, advantages))
    datums = [
        build_opd_datum(p, c, lp, adv, weighted=objective.logit_level) for p, c, lp, adv in rows
    ]
    device = student.placement.device
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        if args.child == "direct":
            ids = torch.tensor([p + c[:-1] for p, c, *_ in rows], device=device)
            first = args.prompt - 1
            logprobs = student.model(input_ids=ids).logits[:, first:].float().log_softmax(-1)
            with torch.no_grad():
                scored = teacher.model(input_ids=ids).logits[:, first:].float().log_softmax(-1)
            value = divergence(logprobs, scored, objective)[0]
            value.mean().backward()
        elif objective.logit_level:
            shares = [[(teacher, 1.0)]] * len(datums)
            await (await student.forward_backward_logits_async(datums, shares, objective))
        else:
            await (await student.forward_backward_async(datums, "importance_sampling"))
        await (await student.optim_step_async(AdamParams()))
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated() / 2**20
    return {"step_seconds": statistics.median(times), "peak_mib": peak}


def measure(name: str, args: argparse.Namespace, model: Path) -> dict[str, float]:
    command = [sys.executable, __file__, "--child", name, "--model", str(model)]
    for option in ("vocab", "rows", "completion", "prompt", "steps", "device"):
        command += [f"--{option}", str(getattr(args, option))]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode:
        return {"error": done.stderr.strip().splitlines()[-1] if done.stderr else "failed"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def table(figures: dict[str, dict[str, float]], args: argparse.Namespace) -> str:
    base = figures["sampled_reverse_kl"]
    positions = args.rows * args.completion
    lines = [
        f"vocabulary {args.vocab}, {args.rows} x {args.completion} completion positions "
        f"({positions}), device {args.device}; peak is "
        + ("GPU memory allocated" if args.device == "cuda" else "the process's resident memory"),
        f"{'objective':<20} {'step (s)':>9} {'x ref':>6} {'peak (MiB)':>11} {'x ref':>6}",
    ]
    for name, row in figures.items():
        if "error" in row:
            lines.append(f"{name:<20} failed: {row['error']}")
            continue
        seconds, peak = row["step_seconds"], row["peak_mib"]
        lines.append(
            f"{name:<20} {seconds:>9.3f} {seconds / base['step_seconds']:>6.2f}"
            f" {peak:>11.0f} {peak / base['peak_mib']:>6.2f}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab", type=int, default=151_936)
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--completion", type=int, default=256)
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--only", nargs="*", choices=list(OBJECTIVES), default=list(OBJECTIVES))
    parser.add_argument("--json", type=Path)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(asyncio.run(train(args))))
        return
    with tempfile.TemporaryDirectory(prefix="opd-objective-memory-") as folder:
        model = Path(folder) / "model"
        write_model(model, args.vocab)
        names = ["sampled_reverse_kl", *(n for n in args.only if n != "sampled_reverse_kl")]
        figures = {name: measure(name, args, model) for name in names}
    print(table(figures, args))
    if args.json:
        args.json.write_text(
            json.dumps(
                {"settings": vars(args) | {"json": None}, "figures": figures}, indent=2, default=str
            )
        )


if __name__ == "__main__":
    main()
