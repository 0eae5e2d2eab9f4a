"""Train the built-in arithmetic presets on a CPU, from fixed seeds, and write their weights.

    python scripts/train_arith_presets.py [--threads 1] [--out DIR] [--only NAME ...]

Each teacher is a small Qwen3 over the tiny presets' byte-level tokenizer, trained with
plain supervised learning to answer a problem's chat prompt with `\\boxed{answer}<|im_end|>`;
`arith-teacher-template` is arith-teacher's recipe with a chat template of its own (a system
line, other role names: `presets.OWN_TEMPLATES`), its prompts rendered by that template
only, so it is measured both ways (`accuracy_student_template`: from the student's);
`arith-teacher-bpe` is the same recipe over a tokenizer of its own (`presets.bpe_tokenizer`:
a BPE with merges for numbers and frequent words, other special tokens, another template),
the teacher of cross-tokenizer distillation.
The problems are the `arithmetic` source's with one-digit operands, small enough that a
model this size learns every one of them in minutes on a shared CPU: a teacher is an
oracle for its operations (it trains on all their problems), and the demo's student is
the one evaluated on problems outside its own training pool. `arith-student` is
arith-teacher plus a rank-4 LoRA taught to answer every problem one too high, merged: it
answers in a box but is mostly wrong, and a LoRA of rank >= 4 can learn the change back
from some problems and so fix the others. The weights
(float16 safetensors) and `manifest.json` (sha256, sizes, recipe, and the accuracies
sampled at temperature 1 and graded by the eval's grader) go to
worker/engine/backends/local/weights/.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import Qwen3ForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernel.model_names import (
    ARITH_STUDENT,
    ARITH_TEACHER,
    ARITH_TEACHER_ADD,
    ARITH_TEACHER_BPE,
    ARITH_TEACHER_MUL,
    ARITH_TEACHER_TEMPLATE,
)
from kernel.spec import ArithmeticDataset
from kernel.spec.data import ArithmeticOp
from worker.engine.backends.local.models import Placement
from worker.engine.backends.local.presets import (
    OWN_TEMPLATES,
    preset_config,
    preset_tokenizer,
    tiny_tokenizer,
)
from worker.engine.backends.local.runner import SerialRunner
from worker.engine.backends.local.sampler import LocalSamplingClient
from worker.engine.backends.local.trained import WEIGHTS_DIR, save_trained, trained_model
from worker.engine.backends.local.trainer import attach_lora
from worker.engine.data.arithmetic import Problem, training_problems
from worker.engine.data.prompts import build_prompt
from worker.engine.eval.grading import Grader
from worker.engine.eval.sampler_accuracy import answer

SUFFIX = ArithmeticDataset().question_suffix
ALL_OPS: tuple[ArithmeticOp, ...] = ("add", "sub", "mul")
MEASURE_SEED = 11
IGNORE = -100
STUDENT_RANK = 4
STUDENT_PROBE_ACCURACY = 0.25
STUDENT_PROBE_BOXED = 0.95


@dataclass(frozen=True)
class Recipe:
    ops: tuple[ArithmeticOp, ...]
    steps: int
    seed: int
    sizes: dict[str, int] = field(
        default_factory=lambda: {
            "hidden_size": 64,
            "intermediate_size": 256,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 16,
        }
    )
    learning_rate: float = 7e-3
    batch_size: int = 32
    warmup_steps: int = 30


RECIPES = {
    ARITH_TEACHER: Recipe(ALL_OPS, steps=700, seed=1),
    ARITH_TEACHER_ADD: Recipe(("add",), steps=400, seed=2),
    ARITH_TEACHER_MUL: Recipe(("mul",), steps=400, seed=3),
    ARITH_TEACHER_TEMPLATE: Recipe(ALL_OPS, steps=700, seed=5),
    ARITH_TEACHER_BPE: Recipe(ALL_OPS, steps=700, seed=6),
}
STUDENT_RECIPE = Recipe(ALL_OPS, steps=150, seed=4, learning_rate=1e-2)
"""How arith-student's LoRA is taught (its `sizes` are the teacher's)."""
MEASURED_OPS: dict[str, tuple[ArithmeticOp, ...]] = {
    ARITH_TEACHER: ALL_OPS,
    ARITH_STUDENT: ALL_OPS,
    ARITH_TEACHER_ADD: ("add", "mul"),
    ARITH_TEACHER_MUL: ("add", "mul"),
    ARITH_TEACHER_TEMPLATE: ALL_OPS,
    ARITH_TEACHER_BPE: ALL_OPS,
}


def op_dataset(op: ArithmeticOp) -> ArithmeticDataset:
    """Every one-digit problem of `op` (0..9 op 0..9; sub keeps the first the larger)."""
    one_digit = ArithmeticDataset(ops=[op], digits=1, multiplier_digits=1)
    return one_digit.model_copy(update={"count": one_digit.problem_count(op)})


def problems_of(ops: tuple[ArithmeticOp, ...]) -> list[Problem]:
    return [p for op in ops for p in training_problems(op_dataset(op))]


def encoded(
    problems: list[Problem], answers: list[str], tokenizer: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """Input ids and labels (the boxed answer and <|im_end|> only), right-padded; the
    prompts rendered by `tokenizer`'s chat template."""
    rows = []
    for problem, answer_text in zip(problems, answers, strict=True):
        prompt = build_prompt(tokenizer, problem.question, SUFFIX, False)
        target = tokenizer.encode(f"\\boxed{{{answer_text}}}", add_special_tokens=False)
        rows.append((prompt, [*target, tokenizer.eos_token_id]))
    width = max(len(p) + len(t) for p, t in rows)
    ids = torch.full((len(rows), width), tokenizer.pad_token_id)
    labels = torch.full((len(rows), width), IGNORE)
    for row, (prompt, target) in enumerate(rows):
        ids[row, : len(prompt) + len(target)] = torch.tensor(prompt + target)
        labels[row, len(prompt) : len(prompt) + len(target)] = torch.tensor(target)
    return ids, labels


def train(name: str, recipe: Recipe) -> Qwen3ForCausalLM:
    problems = problems_of(recipe.ops)
    torch.manual_seed(recipe.seed)
    tokenizer = preset_tokenizer(name)
    model = Qwen3ForCausalLM(preset_config(tokenizer, **recipe.sizes))
    fit(model, problems, [p.answer for p in problems], recipe, tokenizer)
    return model.eval()


def fit(
    model: torch.nn.Module,
    problems: list[Problem],
    answers: list[str],
    recipe: Recipe,
    tokenizer: Any,
) -> None:
    """Supervised learning of `answers` to `problems`: AdamW, warmup then cosine decay."""
    ids, labels = encoded(problems, answers, tokenizer)
    trained = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(
        trained, lr=recipe.learning_rate, betas=(0.9, 0.98), weight_decay=0.01
    )
    order = np.random.default_rng(recipe.seed)
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
        torch.nn.utils.clip_grad_norm_(trained, 1.0)
        optimizer.step()
        if step % 50 == 0:
            seconds = time.perf_counter() - started
            print(f"  step {step}: loss {loss.item():.4f} ({seconds:.0f} s)", flush=True)


@torch.no_grad()
def probe(model: Qwen3ForCausalLM, problems: list[Problem], seed: int) -> tuple[float, float]:
    """A quick look at completions sampled at temperature 1: the fraction that are exactly
    `\\boxed{answer}`, and the fraction that are a box at all."""
    tokenizer = tiny_tokenizer()
    prompts = [build_prompt(tokenizer, p.question, SUFFIX, False) for p in problems]
    width = max(map(len, prompts))
    ids = torch.full((len(prompts), width), tokenizer.pad_token_id)
    mask = torch.zeros_like(ids)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.tensor(prompt)
        mask[row, width - len(prompt) :] = 1
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            max_new_tokens=12,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
    texts = tokenizer.batch_decode(out[:, width:], skip_special_tokens=True)
    expected = [f"\\boxed{{{p.answer}}}" for p in problems]
    right = np.mean([t == e for t, e in zip(texts, expected, strict=True)])
    boxed = np.mean([t.startswith("\\boxed{") and t.endswith("}") for t in texts])
    return float(right), float(boxed)


def mistaught(teacher: Qwen3ForCausalLM) -> Qwen3ForCausalLM:
    """The teacher plus a rank-STUDENT_RANK LoRA taught to answer every problem one too
    high, merged: it keeps the format and is mostly wrong, and the change is one a LoRA
    can learn back."""
    problems = problems_of(ALL_OPS)
    student = Qwen3ForCausalLM(teacher.config)
    student.load_state_dict(teacher.state_dict())
    adapted = attach_lora(student, STUDENT_RANK, STUDENT_RECIPE.seed)
    answers = [str(int(p.answer) + 1) for p in problems]
    fit(adapted, problems, answers, STUDENT_RECIPE, preset_tokenizer(ARITH_STUDENT))
    student = adapted.merge_and_unload().eval()
    right, boxed = probe(student, problems, STUDENT_RECIPE.seed)
    print(f"  student: right {right:.0%}, boxed {boxed:.0%}", flush=True)
    if right > STUDENT_PROBE_ACCURACY or boxed < STUDENT_PROBE_BOXED:
        raise RuntimeError("the student came out too right or without its boxes")
    return student


async def measure(name: str, folder: Path) -> dict[str, float]:
    """Accuracy per operation and the boxed fraction of the stored preset over every
    problem of the operations measured, sampled at temperature 1, graded as evals grade;
    a preset with its own chat template also from the student's (`_student_template`)."""
    model = trained_model(name, folder)
    placement = Placement(torch.device("cpu"), torch.float32)
    tokenizer = preset_tokenizer(name)
    sampler = LocalSamplingClient(SerialRunner(), model, tokenizer, placement, {}, 0)
    ops = MEASURED_OPS[name]
    async with Grader() as grader:
        problems, grade = problems_of(ops), grader.grade_answers
        answers = await answer(sampler, tokenizer, problems, SUFFIX, grade, MEASURE_SEED)
        figures = {f"accuracy_{op}": answers.accuracy(op) for op in ops}
        figures |= {"accuracy": answers.accuracy(), "boxed": answers.boxed_fraction()}
        if name in OWN_TEMPLATES:
            theirs = await answer(sampler, tiny_tokenizer(), problems, SUFFIX, grade, MEASURE_SEED)
            figures["accuracy_student_template"] = theirs.accuracy()
    return figures


def store(name: str, model: Qwen3ForCausalLM, record: dict, folder: Path) -> None:
    """Save, then measure the stored weights and save again with the figures."""
    save_trained(name, model, record, folder)
    figures = asyncio.run(measure(name, folder))
    save_trained(name, model, record | {"measured": figures}, folder)
    print(f"{name}: " + ", ".join(f"{key} {value:.0%}" for key, value in figures.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=WEIGHTS_DIR)
    presets = [*RECIPES, ARITH_STUDENT]  # the student is made from the stored teacher
    parser.add_argument("--only", nargs="*", choices=presets, default=presets)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    problems = {
        op: op_dataset(op).model_dump(include={"ops", "digits", "multiplier_digits"})
        for op in ALL_OPS
    }
    for name in [p for p in presets if p in args.only]:
        if name == ARITH_STUDENT:
            started = time.perf_counter()
            student = mistaught(trained_model(ARITH_TEACHER, args.out))
            record = {
                "problems": problems,
                "from_teacher": {"lora_rank": STUDENT_RANK, "answers": "one too high"}
                | asdict(STUDENT_RECIPE),
                "train_minutes": round((time.perf_counter() - started) / 60, 1),
            }
            store(name, student, record, args.out)
            continue
        recipe = RECIPES[name]
        print(f"{name}: {', '.join(recipe.ops)}, {recipe.steps} steps", flush=True)
        started = time.perf_counter()
        teacher = train(name, recipe)
        record = {
            "recipe": asdict(recipe),
            "chat_template": "own" if name in (*OWN_TEMPLATES, ARITH_TEACHER_BPE) else "ChatML",
            "tokenizer": "bpe" if name == ARITH_TEACHER_BPE else "byte-level",
            "problems": problems,
            "train_minutes": round((time.perf_counter() - started) / 60, 1),
            "threads": args.threads,
        }
        store(name, teacher, record, args.out)


if __name__ == "__main__":
    main()
