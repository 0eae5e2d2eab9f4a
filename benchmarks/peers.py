"""The arithmetic demo in TRL's DistillationTrainer and in opd's loop, side by side in one
run, both graded by the eval's own code.

    python benchmarks/peers.py [--seeds 42 1 3] [--steps 200] [--every 50]
                               [--betas 1 0 0.5] [--objectives sampled_reverse_kl jsd ...]
                               [--shapes 8x4 32x1] [--set optim.grad_clip_norm=1.0 ...]
                               [--eval-samples 4] [--json out.json]
    python benchmarks/peers.py --tables out.json      # the tables again, from the curves

Every run is the demo's job (examples/arith.yaml: arith-student, a rank-32 LoRA from the
seed, learning from arith-teacher on its 150-problem training pool, lr 3e-3, 12 tokens at
temperature 1, one torch thread), for each seed one after the other: TRL 1.16's
`DistillationTrainer` (on-policy, one divergence per `--betas` value: 1 reverse KL, 0
forward KL, 0.5 JSD; 32 prompts x 1 completion a step) training the very LoRA model the
local backend made, and opd's `run_loop` with each `--objectives` value as `loop.objective`
and each `--shapes` batch x group (and `--set`'s settings). Every student is evaluated by
the loop's `Evaluation` (the same held-out problems, sampler, seeds and grader) before the
first step, every `--every` steps and after the last. Step time is the steps' wall time,
evals left out. See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import yaml
from datasets import Dataset
from transformers import (
    PrinterCallback,
    TrainerCallback,
    TrainerControl,
    TrainerState,
    TrainingArguments,
)
from trl import DistillationConfig, DistillationTrainer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from learning import DEMO_SPEC, Curve, Row, set_setting
from learning import run as run_opd

from kernel.spec import JobSpec
from worker.engine.backends.local import LocalServiceClient, LocalTrainingClient
from worker.engine.backends.local.models import load_model
from worker.engine.data.datasets import load_datasets
from worker.engine.data.mixing import training_pools
from worker.engine.data.prompts import render
from worker.engine.eval.evaluation import Evaluation, Grade, due
from worker.engine.eval.grading import Grader
from worker.engine.eval.prompts import load_eval_prompts
from worker.engine.loop.run import Run, eval_pools, evaluation_for, open_run

DIVERGENCES = {1.0: "reverse KL", 0.0: "forward KL", 0.5: "JSD"}
OBJECTIVES = [
    "sampled_reverse_kl",
    "reverse_kl",
    "forward_kl",
    "jsd",
    "{kind: forward_kl, top_k: 16}",
]
"""opd's runs by default: the reference and each logit-level objective (full vocabulary),
and teacher top-16 forward KL, the one a remote trainer's 2-D cross-entropy can take."""
TRL_BATCH = 32


@dataclass(frozen=True)
class Peer:
    """One row: TRL with a divergence, or opd with an objective and a batch x group."""

    label: str
    trainer: str  # "trl" or "opd"
    setting: dict[str, Any]


def demo_base(args: argparse.Namespace) -> dict[str, Any]:
    """The demo's job with the run's steps and evals."""
    base = yaml.safe_load(DEMO_SPEC.read_text())
    base["loop"]["steps"] = args.steps
    base["eval"] |= {
        "every": args.every,
        "holdout": args.holdout,
        "samples_per_prompt": args.eval_samples,
    }
    return base


def peers(args: argparse.Namespace) -> list[Peer]:
    rows = [
        Peer(f"TRL {DIVERGENCES.get(beta, 'GJSD')} (beta {beta:g})", "trl", {"beta": beta})
        for beta in args.betas
    ]
    for text in args.objectives:
        objective = yaml.safe_load(text)
        for shape in args.shapes:
            batch, group = (int(n) for n in shape.split("x"))
            label = f"opd {objective_label(objective)} ({batch}x{group})"
            setting = {
                "loop.objective": objective,
                "loop.batch_size": batch,
                "loop.group_size": group,
            }
            rows.append(Peer(label, "opd", setting | dict(map(assignment, args.set))))
    return rows


def assignment(text: str) -> tuple[str, Any]:
    """`optim.grad_clip_norm=1.0` as (its dotted setting, its YAML value)."""
    key, _, value = text.partition("=")
    return key, yaml.safe_load(value)


def objective_label(objective: str | dict[str, Any]) -> str:
    if isinstance(objective, str):
        return objective
    label = objective["kind"]
    if objective.get("top_k"):
        label += f" top-{objective['top_k']}"
    if objective.get("beta") is not None:
        label += f" beta {objective['beta']:g}"
    if objective.get("tail") is False:
        label += " no tail"
    return label


def peer_spec(base: dict[str, Any], peer: Peer, seed: int) -> JobSpec:
    data = json.loads(json.dumps(base))
    data["student"]["seed"] = seed
    if peer.trainer == "trl":
        # The eval's settings; TRL samples the 32 completions a step itself.
        data["loop"] |= {"batch_size": TRL_BATCH, "group_size": 1}
    else:
        for key, value in peer.setting.items():
            set_setting(data, key, value)
    return JobSpec.model_validate(data)


def trainer_settings() -> dict[str, Any]:
    """What a TRL trainer here is told beside its recipe: what the local backend runs (fp32
    on the CPU; checkpointing only saves memory), and nothing logged or saved."""
    return {
        "bf16": False,
        "gradient_checkpointing": False,
        "use_cpu": not torch.cuda.is_available(),
        "report_to": "none",
        "save_strategy": "no",
        "logging_strategy": "no",
        "disable_tqdm": True,
    }


class Evals(TrainerCallback):
    """The opd eval at its boundaries of TRL's steps, run on the event loop (where the
    grader lives) while the training thread waits; the steps' own time is added up."""

    def __init__(self, evaluate: Any, loop: asyncio.AbstractEventLoop, curve: Curve) -> None:
        self.evaluate, self.loop, self.curve = evaluate, loop, curve
        self.began = 0.0

    def on_step_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **_: Any
    ) -> None:
        self.began = time.perf_counter()

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **_: Any
    ) -> None:
        self.curve.trained_seconds += time.perf_counter() - self.began
        asyncio.run_coroutine_threadsafe(self.evaluate(state.global_step), self.loop).result()


def trl_prompts(run: Run, spec: JobSpec, prompts: Any) -> Dataset:
    """The training pool as TRL's `prompt` column: each question rendered exactly as opd
    renders it (chat template, suffix, no thinking), as text the tokenizer reads back into
    the same ids."""
    texts = []
    for pool in training_pools(spec, prompts):
        for prompt in pool.prompts.prompts:
            ids = render(run.tokenizer, prompt, pool.options)
            text = run.tokenizer.decode(ids)
            assert run.tokenizer(text=text)["input_ids"] == ids, text
            texts.append(text)
    return Dataset.from_dict({"prompt": texts})


async def run_trl(spec: JobSpec, beta: float, artifacts: Path, grade: Grade) -> tuple[Curve, float]:
    """TRL's DistillationTrainer on the LoRA model the local backend made for this spec
    (the same base, rank, init seed and fp32), evaluated by opd's eval; and the norm of
    the LoRA B matrices the eval's sampler read last (0 at init: TRL trained what the eval
    graded when it is not)."""
    prompts = load_datasets(spec, artifacts, False)
    eval_prompts = load_eval_prompts(spec, artifacts, False)
    curve = Curve()
    run = await open_run(spec, LocalServiceClient(spec.local, artifacts), curve, None)
    evaluation: Evaluation = evaluation_for(run, eval_pools(spec, eval_prompts), grade)
    student = run.training
    assert isinstance(student, LocalTrainingClient)

    async def evaluate(step: int) -> None:
        if due(evaluation.spec, step, spec.loop.steps):
            # The eval sampler's seeds follow the optimizer steps taken, as in opd's runs.
            student.steps = step
            curve.eval(step, await run.evaluate(evaluation, step))

    config = DistillationConfig(
        output_dir=str(artifacts / "trl"),
        per_device_train_batch_size=TRL_BATCH,
        max_steps=spec.loop.steps,
        learning_rate=spec.optim.learning_rate,
        beta=beta,
        temperature=spec.sampling.temperature,
        max_completion_length=spec.sampling.max_tokens,
        seed=spec.student.seed,
        **trainer_settings(),
    )
    teacher = load_model(spec.teacher.base_model, torch.float32)  # type: ignore[union-attr]
    trainer = DistillationTrainer(
        model=student.model,
        teacher_model=teacher,
        args=config,
        train_dataset=trl_prompts(run, spec, prompts),
        processing_class=student.tokenizer,
        callbacks=[Evals(evaluate, asyncio.get_running_loop(), curve)],
    )
    trainer.remove_callback(PrinterCallback)  # its summary line; the eval's figures are ours
    await evaluate(0)

    def train() -> None:
        torch.set_num_threads(spec.local.cpu_threads)  # per thread, as the local runner does
        trainer.train()

    await asyncio.to_thread(train)
    weights, _ = student.snapshot()
    lora_b = [w for name, w in weights.items() if "lora_B" in name]
    return curve, float(torch.linalg.vector_norm(torch.cat([w.flatten() for w in lora_b])))


async def run_all(args: argparse.Namespace, rows: list[Peer]) -> dict[str, list[dict[str, Any]]]:
    """Every peer's curve per seed; seed by seed, each peer after the other."""
    base = demo_base(args)
    curves: dict[str, list[dict[str, Any]]] = {peer.label: [] for peer in rows}
    async with Grader() as grader:
        for seed in args.seeds:
            for peer in rows:
                spec = peer_spec(base, peer, seed)
                extra: dict[str, Any] = {"seed": seed}
                with tempfile.TemporaryDirectory() as artifacts:
                    if peer.trainer == "trl":
                        beta = peer.setting["beta"]
                        curve, norm = await run_trl(
                            spec, beta, Path(artifacts), grader.grade_answers
                        )
                        extra["lora_b_norm"] = norm
                    else:
                        curve = await run_opd(spec, None, Path(artifacts), grader.grade_answers)
                curves[peer.label].append(asdict(curve) | extra)
                print(
                    f"  {peer.label} seed {seed}: "
                    + " ".join(
                        f"{s}: {a:.1%}" for s, a in zip(curve.steps, curve.accuracy, strict=True)
                    )
                    + f" ({curve.trained_seconds:.1f} s of steps)",
                    flush=True,
                )
    return curves


def curve_of(run: dict[str, Any]) -> Curve:
    return Curve(**{k: v for k, v in run.items() if k in Curve.__dataclass_fields__})


def print_tables(figures: dict[str, Any]) -> dict[str, Any]:
    """The tables, and the summary figures they end with."""
    rows = {
        label: Row(label, [curve_of(r) for r in runs]) for label, runs in figures["runs"].items()
    }
    seeds = [r["seed"] for r in next(iter(figures["runs"].values()))]
    any_row = next(iter(rows.values()))
    steps = any_row.curves[0].steps
    teachers = [c.teacher for row in rows.values() for c in row.curves if c.teacher is not None]
    before = statistics.mean(row.at_step(0)[0] for row in rows.values())
    teacher = statistics.mean(teachers)
    width = max(len(label) for label in rows) + 2
    print(
        f"\nheld-out accuracy ({figures['settings']['holdout']} problems x "
        f"{figures['settings']['eval_samples']} answers): student before {before:.1%}, "
        f"teacher {teacher:.1%}"
    )
    for index, step in enumerate(steps):
        if step == 0:
            continue
        print(
            f"\n{'step ' + str(step):<{width}}"
            + "".join(f"{'seed ' + str(s):>10}" for s in seeds)
            + f"{'mean':>10}"
        )
        for label, row in rows.items():
            cells = [f"{c.accuracy[index]:.1%}" for c in row.curves]
            print(
                f"{label:<{width}}"
                + "".join(f"{c:>10}" for c in cells)
                + f"{row.at_step(index)[0]:>10.1%}"
            )
    last = len(steps) - 1
    trl = {label: row for label, row in rows.items() if label.startswith("TRL")}
    best_label = max(trl, key=lambda label: trl[label].at_step(last)[0]) if trl else None
    summary: dict[str, Any] = {"before": before, "teacher": teacher, "rows": {}}
    print(
        f"\n{'summary':<{width}}{'at ' + str(steps[-1]):>10}{'gap closed':>12}"
        f"{'steps took':>12}{'per step':>10}{'to TRL best':>13}"
    )
    target = trl[best_label].at_step(last)[0] if best_label else None
    trl_seconds = trl[best_label].trained_seconds() if best_label else None
    for label, row in rows.items():
        final = row.at_step(last)[0]
        gap = (final - row.at_step(0)[0]) / (teacher - row.at_step(0)[0])
        seconds = row.trained_seconds()
        reach = row.time_to_reach(target) if target is not None else None
        ratio = None if reach is None or not trl_seconds else reach / trl_seconds
        summary["rows"][label] = {
            "accuracy": final,
            "gap_closed": gap,
            "trained_seconds": seconds,
            "time_to_trl_best": reach,
            "ratio_to_trl_best": ratio,
        }
        shown = "-" if target is None else ("not reached" if ratio is None else f"{ratio:.2f}x")
        print(
            f"{label:<{width}}{final:>10.1%}{gap:>12.0%}{seconds:>10.1f} s"
            f"{1000 * seconds / steps[-1]:>7.0f} ms{shown:>13}"
        )
    if best_label:
        print(
            f"to TRL best: the first eval where the run's mean accuracy reaches {best_label}'s "
            f"{target:.1%} at step {steps[-1]}, its time over that run's {trl_seconds:.1f} s"
        )
    summary["trl_best"] = best_label
    return summary


def cpu_name() -> str:
    """The CPU's model name (its float kernels move the figures), as Linux reports it."""
    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.is_file() else []
    names = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]
    return names[0] if names else platform.machine()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[42, 1, 3])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--every", type=int, default=50)
    parser.add_argument("--holdout", type=int, default=100)
    parser.add_argument("--eval-samples", type=int, default=4, help="answers per problem")
    parser.add_argument("--betas", type=float, nargs="*", default=list(DIVERGENCES))
    parser.add_argument(
        "--objectives",
        nargs="*",
        default=OBJECTIVES,
        help="loop.objective values, each a name or a YAML mapping",
    )
    parser.add_argument("--shapes", nargs="+", default=["8x4"], help="opd's batch x group")
    parser.add_argument(
        "--set",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="more settings of every opd run (optim.grad_clip_norm=1.0)",
    )
    parser.add_argument("--json", type=Path, help="keep every curve in this file")
    parser.add_argument("--tables", type=Path, help="print a --json file's tables, run nothing")
    args = parser.parse_args()
    if args.tables:
        print_tables(json.loads(args.tables.read_text()))
        return
    # transformers' notices of renamed TrainingArguments fields, once per TRL run.
    warnings.filterwarnings("ignore", category=FutureWarning)
    torch.set_num_threads(1)
    rows = peers(args)
    load = os.getloadavg()[0]
    print(
        f"peers: {len(rows)} runs x {len(args.seeds)} seeds, {args.steps} steps, eval every "
        f"{args.every} on {args.holdout} held-out problems x {args.eval_samples}; "
        f"{cpu_name()}, {os.cpu_count()} CPUs, load average {load:.2f}"
    )
    started = time.perf_counter()
    runs = asyncio.run(run_all(args, rows))
    figures: dict[str, Any] = {
        "settings": {
            "seeds": args.seeds,
            "steps": args.steps,
            "every": args.every,
            "holdout": args.holdout,
            "eval_samples": args.eval_samples,
            "peers": [asdict(peer) for peer in rows],
            "machine": f"{cpu_name()}, {os.cpu_count()} CPUs",
            "load_average": [load, os.getloadavg()[0]],
            "seconds": time.perf_counter() - started,
        },
        "runs": runs,
    }
    figures["summary"] = print_tables(figures)
    print(
        f"\n{figures['settings']['seconds']:.0f} s in all; load average {load:.2f} at the "
        f"start, {os.getloadavg()[0]:.2f} at the end"
    )
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
