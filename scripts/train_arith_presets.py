"""Train the built-in arithmetic presets on a CPU, from fixed seeds, and write their weights.

    python scripts/train_arith_presets.py [--threads 2] [--out DIR] [--only NAME ...]

Each teacher is a small Qwen3 over the tiny presets' byte-level tokenizer, trained with
plain supervised learning to answer a generated problem's chat prompt with
`\\boxed{answer}<|im_end|>`. Its problems come from the `arithmetic` dataset source (per
operation, a seeded three-quarters of the problems), and it is measured on problems it
never trained on. `arith-student` is the all-operations teacher's run stopped early: it
already answers in a box, but rarely right. The weights (float16 safetensors) and
`manifest.json` (sha256, sizes, recipe, accuracies sampled at temperature 1 and graded by
the eval's grader) go to worker/engine/backends/local/weights/.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from transformers import Qwen3ForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernel.spec import ArithmeticDataset, ArithmeticOp
from worker.engine.arithmetic import Problem, held_out_problems, training_problems
from worker.engine.backends.local.models import Placement
from worker.engine.backends.local.presets import preset_config, tiny_tokenizer
from worker.engine.backends.local.runner import SerialRunner
from worker.engine.backends.local.sampler import LocalSamplingClient
from worker.engine.backends.local.trained import (
    ARITH_STUDENT,
    ARITH_TEACHER,
    ARITH_TEACHER_ADD,
    ARITH_TEACHER_MUL,
    WEIGHTS_DIR,
    save_trained,
    trained_model,
)
from worker.engine.datums import build_prompt
from worker.engine.eval.grading import Grader
from worker.engine.eval.sampler_accuracy import answer

SUFFIX = ArithmeticDataset().question_suffix
TRAIN_FRACTION = 0.75
PROBLEM_SEED = 7
MEASURE_PROBLEMS = 200  # per operation
MEASURE_SEED = 11
IGNORE = -100


@dataclass(frozen=True)
class Recipe:
    ops: tuple[ArithmeticOp, ...]
    steps: int
    seed: int
    sizes: dict[str, int] = field(
        default_factory=lambda: {
            "hidden_size": 128,
            "intermediate_size": 256,
            "num_hidden_layers": 4,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 32,
        }
    )
    learning_rate: float = 3e-3
    batch_size: int = 64
    warmup_steps: int = 50
    student_at: int | None = None
    """Also keep the weights after this many steps, as arith-student."""


RECIPES = {
    ARITH_TEACHER: Recipe(("add", "sub", "mul"), steps=1500, seed=1, student_at=300),
    ARITH_TEACHER_ADD: Recipe(("add",), steps=800, seed=2),
    ARITH_TEACHER_MUL: Recipe(("mul",), steps=800, seed=3),
}
MEASURED_OPS: dict[str, tuple[ArithmeticOp, ...]] = {
    ARITH_TEACHER: ("add", "sub", "mul"),
    ARITH_STUDENT: ("add", "sub", "mul"),
    ARITH_TEACHER_ADD: ("add", "mul"),
    ARITH_TEACHER_MUL: ("add", "mul"),
}


def op_dataset(op: ArithmeticOp) -> ArithmeticDataset:
    """One operation's problems, a seeded TRAIN_FRACTION of them in the training pool."""
    whole = ArithmeticDataset(ops=[op]).problem_count(op)
    return ArithmeticDataset(ops=[op], count=int(TRAIN_FRACTION * whole), seed=PROBLEM_SEED)


def encoded(problems: list[Problem]) -> tuple[torch.Tensor, torch.Tensor]:
    """Input ids and labels (the answer and <|im_end|> only), right-padded."""
    tokenizer = tiny_tokenizer()
    rows = []
    for problem in problems:
        prompt = build_prompt(tokenizer, problem.question, SUFFIX, False)
        target = tokenizer.encode(f"\\boxed{{{problem.answer}}}", add_special_tokens=False)
        rows.append((prompt, [*target, tokenizer.eos_token_id]))
    width = max(len(p) + len(t) for p, t in rows)
    ids = torch.full((len(rows), width), tokenizer.pad_token_id)
    labels = torch.full((len(rows), width), IGNORE)
    for row, (prompt, target) in enumerate(rows):
        ids[row, : len(prompt) + len(target)] = torch.tensor(prompt + target)
        labels[row, len(prompt) : len(prompt) + len(target)] = torch.tensor(target)
    return ids, labels


def train(recipe: Recipe) -> tuple[Qwen3ForCausalLM, Qwen3ForCausalLM | None]:
    """The model after recipe.steps steps, and after recipe.student_at steps if asked."""
    ids, labels = encoded([p for op in recipe.ops for p in training_problems(op_dataset(op))])
    torch.manual_seed(recipe.seed)
    model = Qwen3ForCausalLM(preset_config(tiny_tokenizer(), **recipe.sizes))
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=recipe.learning_rate, betas=(0.9, 0.98), weight_decay=0.01
    )
    order = np.random.default_rng(recipe.seed)
    student = None
    started = time.perf_counter()
    for step in range(1, recipe.steps + 1):
        warmup = min(1.0, step / recipe.warmup_steps)
        decay = 0.5 * (1 + math.cos(math.pi * step / recipe.steps))
        for group in optimizer.param_groups:
            group["lr"] = recipe.learning_rate * warmup * decay
        rows = torch.from_numpy(order.integers(len(ids), size=recipe.batch_size))
        loss = model(input_ids=ids[rows], labels=labels[rows]).loss
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if step % 100 == 0:
            print(
                f"  step {step}: loss {loss.item():.4f} ({time.perf_counter() - started:.0f} s)",
                flush=True,
            )
        if step == recipe.student_at:
            student = Qwen3ForCausalLM(model.config)
            student.load_state_dict(model.state_dict())
    return model.eval(), student


async def measure(name: str, folder: Path, ops: tuple[ArithmeticOp, ...]) -> dict[str, float]:
    """Accuracy per operation and the boxed fraction of the stored preset, on held-out
    problems, sampled at temperature 1 and graded as an eval grades."""
    model = trained_model(name, folder)
    placement = Placement(torch.device("cpu"), torch.float32)
    sampler = LocalSamplingClient(SerialRunner(), model, tiny_tokenizer(), placement, {}, 0)
    problems = [p for op in ops for p in held_out_problems(op_dataset(op), MEASURE_PROBLEMS, 0)]
    async with Grader() as grader:
        answers = await answer(
            sampler, tiny_tokenizer(), problems, SUFFIX, grader.grade_answers, MEASURE_SEED
        )
    figures = {f"accuracy_{op}": answers.accuracy(op) for op in ops}
    return figures | {"accuracy": answers.accuracy(), "boxed": answers.boxed_fraction()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=WEIGHTS_DIR)
    parser.add_argument("--only", nargs="*", choices=sorted(RECIPES), default=sorted(RECIPES))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    for name in args.only:
        recipe = RECIPES[name]
        print(f"{name}: {', '.join(recipe.ops)}, {recipe.steps} steps", flush=True)
        started = time.perf_counter()
        teacher, student = train(recipe)
        minutes = (time.perf_counter() - started) / 60
        record = {
            "recipe": asdict(recipe) | {"train_fraction": TRAIN_FRACTION},
            "problem_seed": PROBLEM_SEED,
            "train_minutes": round(minutes, 1),
            "threads": args.threads,
        }
        trained = {name: teacher} | ({ARITH_STUDENT: student} if student is not None else {})
        for preset, model in trained.items():
            steps = recipe.steps if preset == name else recipe.student_at
            save_trained(preset, model, record | {"steps": steps}, args.out)
            figures = asyncio.run(measure(preset, args.out, MEASURED_OPS[preset]))
            save_trained(preset, model, record | {"steps": steps, "measured": figures}, args.out)
            shown = ", ".join(f"{key} {value:.0%}" for key, value in figures.items())
            print(f"{preset}: {shown}", flush=True)


if __name__ == "__main__":
    main()
