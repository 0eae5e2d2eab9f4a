"""A teacher of another family: SmolLM2-135M-Instruct learns one-digit arithmetic from
`arith-teacher` (the byte-level preset: another tokenizer, another chat template), by opd
(examples/smollm2-arith-teacher.yaml) beside TRL 1.16's GOLDTrainer (on-policy distillation
across tokenizers: its ULD loss, and its hybrid of ULD and a JSD over the tokens both
vocabularies share), at equal wall time, graded alike.

    python benchmarks/cross_family.py [--seeds 3] [--peers uld hybrid] [--holdout 60]
                                      [--set loop.steps=40 ...] [--json out.json]
    python benchmarks/cross_family.py --tables out.json [more.json ...]   # the tables, no runs

Per seed (`student.seed` 1, 2, ...): opd's loop trains the example (the engine's `run_loop`
over the local backend, as `opd run` does, its in-loop eval left to the measure below); its
steps' wall time is each GOLD run's budget. GOLD gets what a user would give it: the
teacher as a model folder (the preset saved with its tokenizer), the same LoRA (rank, init
seed), learning rate, sequences a step, completion length and temperature as opd, and as its
off-policy data the teacher's own answer to each training question (sampled once, inside
its budget); its other settings are TRL's defaults (`lmbda` 0.5: half its batches on-policy;
`beta` 0.5). GOLD's teacher reads the student's rendering of each prompt (SmolLM2's chat
template, its default system line included) in the teacher's tokens; the script measures the
teacher on that rendering too. Every student is measured on held-out problems the pool never
holds: its answers sampled greedily and at temperature 1 (as many tokens as opd samples),
graded by math-verify (the last `\\boxed{}` against the reference), per operation, with the
share of answers that box a number at all and what it keeps (the reverse KL to the
untrained base on real_model.py's general questions). The last lines check issue 46's
targets; the exit status is 1 when one is missed. See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import yaml
from datasets import Dataset
from pytrio.types import ModelInput, SamplingParams
from transformers import PrinterCallback
from trl.experimental.gold import GOLDConfig, GOLDTrainer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from learning import set_setting
from peers import trainer_settings
from real_model import (
    GENERAL_QUESTIONS,
    Budget,
    Keeping,
    Timing,
    benchmark_parser,
    benchmark_run,
    each_seed_apart,
    mean,
    seed_range,
    table_head,
    table_line,
    targets,
)

from kernel.spec import JobSpec
from worker.engine.backends.local import LocalServiceClient, LocalTrainingClient
from worker.engine.backends.local.presets import preset_tokenizer
from worker.engine.backends.local.trained import trained_model
from worker.engine.data.datasets import load_datasets
from worker.engine.data.mixing import Item, training_pools
from worker.engine.data.prompts import Prompts, build_prompt, question_text
from worker.engine.eval.grading import Grader
from worker.engine.eval.prompts import load_eval_prompts
from worker.engine.loop.run import Run, close_teachers, eval_pools, evaluation_for, open_run
from worker.engine.loop.steps import run_loop
from worker.engine.tracking.sinks import Sink

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "smollm2-arith-teacher.yaml"
PEERS = {"uld": {}, "hybrid": {"uld_use_hybrid_loss": True}}
"""GOLD's two losses across tokenizers, as GOLDConfig sets them (use_uld_loss beside)."""
ARM_NAMES = {
    "opd": "OPD",
    "uld": "GOLD, ULD (TRL GOLDTrainer)",
    "hybrid": "GOLD, hybrid ULD + JSD",
}
TEMPERATURES = {"greedy": 0.0, "sampled": 1.0}
OPERATIONS = {"+": "add", "-": "sub", "*": "mul"}
BOXED_NUMBER = re.compile(r"\\boxed\{\s*-?\d+\s*\}")
TARGET_CORRECT = 0.40
TARGET_SECONDS = 20 * 60.0


class Holding(LocalServiceClient):
    """The local backend whose student is a training client made already (opd's or TRL's):
    a spec's teachers open over the very weights trained."""

    def __init__(self, training: LocalTrainingClient, spec: JobSpec, artifacts: Path) -> None:
        super().__init__(spec.local, artifacts)
        self.training = training

    async def create_lora_training_client_async(
        self, base_model: str, rank: int = 32, seed: int | None = None
    ) -> LocalTrainingClient:
        return self.training


def example_data(args: argparse.Namespace, seed: int) -> dict[str, Any]:
    """The example with this run's seed and settings, its in-loop eval left out, and
    `--holdout` problems held out for the measure."""
    data = yaml.safe_load(EXAMPLE.read_text())
    data["student"]["seed"] = seed
    for setting in args.set:
        key, value = setting.split("=", 1)
        set_setting(data, key, yaml.safe_load(value))
    data["eval"] = {"holdout": args.holdout, "every": 0, "seed": 0}
    return data


def general_spec(data: dict[str, Any]) -> JobSpec:
    """The example with the untrained base as its teacher (its own tokenizer: the adapter
    off, no context) and the general questions as its eval: its reverse KL is the distance
    from what the student answered before."""
    general = json.loads(json.dumps(data))
    general["teacher"] = {"self": {"weights": "base"}}
    general["loop"] = {k: v for k, v in general["loop"].items() if k != "objective"}
    general["eval"] = {
        "dataset": {"source": "inline", "question_suffix": "", "prompts": GENERAL_QUESTIONS},
        "seed": 0,
    }
    return JobSpec.model_validate(general)


class Task:
    """A seed's spec and prompts, loaded once for every run and measure of it."""

    def __init__(self, data: dict[str, Any], folder: Path) -> None:
        self.spec = JobSpec.model_validate(data)
        self.prompts = load_datasets(self.spec, folder, False)
        [held] = load_eval_prompts(self.spec, folder, False).values()
        self.held_out: Prompts = held
        trained = {q for p in self.prompts.values() for q in p.prompts}
        assert not set(held.prompts) & trained, "held-out problems must be unseen"
        self.general = general_spec(data)
        self.general_prompts = load_eval_prompts(self.general, folder, False)


async def opened(spec: JobSpec, training: LocalTrainingClient, task: Task, folder: Path) -> Run:
    service = Holding(training, spec, folder)
    return await open_run(spec, service, Sink(), None, training_pools(spec, task.prompts))


async def measure(
    task: Task, training: LocalTrainingClient, folder: Path, grader: Grader
) -> dict[str, Any]:
    """The student's held-out answers, greedy and sampled, graded by math-verify, per
    operation; the share that boxes a number; its reverse KL to the base on the general
    questions."""
    run = await opened(task.spec, training, task, folder)
    sampler = await training.save_weights_and_get_sampling_client_async()
    figures: dict[str, Any] = {}
    options = task.spec.dataset_shares()[0]
    for name, temperature in TEMPERATURES.items():
        params = run.params.model_copy(update={"temperature": temperature, "seed": 0})

        async def answer(question: str, params: Any = params) -> str:
            prompt = ModelInput.from_ints(run.render(question, options))
            response = await sampler.sample_async(
                prompt=prompt, num_samples=1, sampling_params=params
            )
            return run.decode(list(response.sequences[0].tokens))

        questions = [str(q) for q in task.held_out.prompts]
        answers = await asyncio.gather(*(answer(q) for q in questions))
        right = await grader.grade_answers(list(answers), list(task.held_out.answers))  # type: ignore[arg-type]
        figures[name] = graded(questions, answers, right)
    await close_teachers(run.teachers)
    base = await opened(task.general, training, task, folder)
    kept = evaluation_for(base, eval_pools(task.general, task.general_prompts), None)
    figures["general_kl"] = (await kept.student(sampler))["eval/reverse_kl_mean"]
    await close_teachers(base.teachers)
    return figures


def graded(questions: list[str], answers: list[str], right: list[bool]) -> dict[str, Any]:
    """Correctness in all and per operation, the share of answers that box a number, and
    the first answers as written."""
    by_operation: dict[str, list[bool]] = {}
    for question, ok in zip(questions, right, strict=True):
        operation = OPERATIONS[question.split()[3]]
        by_operation.setdefault(operation, []).append(ok)
    return {
        "correct": mean([float(ok) for ok in right]),
        "by_operation": {op: mean([float(ok) for ok in oks]) for op, oks in by_operation.items()},
        "boxed": mean([float(bool(BOXED_NUMBER.search(a))) for a in answers]),
        "examples": answers[:6],
    }


async def run_opd(task: Task, folder: Path, grader: Grader) -> dict[str, Any]:
    """The example through opd's loop: its wall time (model load, preflight, steps) and its
    steps' own, then the trained student's figures."""
    service = Keeping(task.spec.local, folder)
    timing = Timing()
    started = time.perf_counter()
    await run_loop(task.spec, service, task.prompts, timing, job_folder=folder)
    wall = time.perf_counter() - started
    assert service.student is not None
    figures = await measure(task, service.student, folder, grader)
    return figures | {"wall_seconds": wall, "step_seconds": sum(timing.seconds)}


def teacher_folder(name: str, folder: Path) -> Path:
    """A preset saved as a model folder with its tokenizer: what a TRL trainer loads."""
    path = folder / name
    if not path.exists():
        trained_model(name).save_pretrained(path)
        preset_tokenizer(name).save_pretrained(path)
    return path


async def teacher_answers(
    task: Task, training: LocalTrainingClient, folder: Path
) -> list[tuple[str, str]]:
    """Each training question and the teacher's answer to it from its own rendering, as
    text: GOLD's off-policy data (what a distillation dataset made by the teacher holds)."""
    run = await opened(task.spec, training, task, folder)
    sampler = await training.save_weights_and_get_sampling_client_async()
    pools = training_pools(task.spec, task.prompts)
    items = [
        Item(q, a, pool)
        for pool in pools
        for q, a in zip(pool.prompts.prompts, pool.prompts.answers, strict=True)
    ]

    async def one(item: Item) -> tuple[str, str]:
        answerer = run.answerer(item, run.render(item.prompt, item.pool.options), sampler)
        params = run.params.model_copy(update={"stop": answerer.stop} if answerer.stop else {})
        response = await answerer.scorer.client.sample_async(
            prompt=ModelInput.from_ints(answerer.scorer.prompt),
            num_samples=1,
            sampling_params=params,
        )
        decode = answerer.decode or run.decode
        return question_text(str(item.prompt), item.pool.options.question_suffix), decode(
            list(response.sequences[0].tokens)
        )

    answers = await asyncio.gather(*(one(item) for item in items))
    await close_teachers(run.teachers)
    return list(answers)


async def teacher_on_student_template(
    task: Task, training: LocalTrainingClient, folder: Path, grader: Grader
) -> float:
    """The teacher's held-out accuracy when it reads the student's rendering of each
    problem (what GOLD's teacher reads), greedy."""
    service = LocalServiceClient(task.spec.local, folder)
    teacher = await service.create_sampling_client_async(task.spec.teacher.base_model)
    theirs = teacher.get_tokenizer()
    student = training.get_tokenizer()
    options = task.spec.dataset_shares()[0]
    params = SamplingParams(
        max_tokens=task.spec.sampling.max_tokens, temperature=0.0, stop=[theirs.eos_token]
    )

    async def one(question: str) -> str:
        text = student.decode(build_prompt(student, question, options.question_suffix, False))
        prompt = theirs.encode(text, add_special_tokens=False)
        response = await teacher.sample_async(
            prompt=ModelInput.from_ints(prompt), num_samples=1, sampling_params=params
        )
        return theirs.decode(list(response.sequences[0].tokens), skip_special_tokens=True)

    answers = await asyncio.gather(*(one(str(q)) for q in task.held_out.prompts))
    right = await grader.grade_answers(list(answers), list(task.held_out.answers))  # type: ignore[arg-type]
    return mean([float(ok) for ok in right])


async def run_gold(
    task: Task, folder: Path, grader: Grader, budget: float, loss: dict[str, Any]
) -> dict[str, Any]:
    """GOLDTrainer with `loss` (ULD, or the hybrid) for `budget` seconds of wall time, the
    teacher's answers to the training questions included."""
    spec = task.spec
    service = LocalServiceClient(spec.local, folder)
    training = await service.create_lora_training_client_async(
        spec.student.base_model, spec.student.lora_rank, spec.student.seed
    )
    teacher = teacher_folder(spec.teacher.base_model, folder)
    started = time.perf_counter()
    answers = await teacher_answers(task, training, folder)
    sampled = time.perf_counter() - started
    dataset = Dataset.from_dict(
        {
            "messages": [
                [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
                for q, a in answers
            ]
        }
    )
    config = GOLDConfig(
        output_dir=str(folder / "gold"),
        per_device_train_batch_size=spec.loop.batch_size * spec.loop.group_size,
        max_steps=10_000,
        learning_rate=spec.optim.learning_rate,
        lr_scheduler_type="constant",
        seed=spec.student.seed,
        max_completion_length=spec.sampling.max_tokens,
        temperature=spec.sampling.temperature,
        top_p=1.0,
        use_uld_loss=True,
        teacher_tokenizer_name_or_path=str(teacher),
        **loss,
        **trainer_settings(),
    )
    trainer = GOLDTrainer(
        model=training.model,
        teacher_model=str(teacher),
        args=config,
        train_dataset=dataset,
        processing_class=training.tokenizer,
        callbacks=[Budget(started, budget)],
    )
    trainer.remove_callback(PrinterCallback)

    def train() -> None:
        torch.set_num_threads(spec.local.cpu_threads)
        trainer.train()

    await asyncio.to_thread(train)
    wall = time.perf_counter() - started
    figures = await measure(task, training, folder, grader)
    return figures | {
        "wall_seconds": wall,
        "sample_seconds": sampled,
        "steps": trainer.state.global_step,
    }


async def untrained(task: Task, folder: Path, grader: Grader) -> dict[str, Any]:
    spec = task.spec
    training = await LocalServiceClient(spec.local, folder).create_lora_training_client_async(
        spec.student.base_model, spec.student.lora_rank, spec.student.seed
    )
    figures = await measure(task, training, folder, grader)
    figures["teacher_on_student_template"] = await teacher_on_student_template(
        task, training, folder, grader
    )
    return figures


async def run_all(args: argparse.Namespace, figures: dict[str, Any]) -> None:
    await each_seed_apart(args, figures, run_seed)


async def run_seed(
    args: argparse.Namespace, seed: int, before: dict[str, Any] | None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """One seed: opd, then each GOLD arm for opd's steps' time, the untrained student
    first when no seed has measured it yet."""
    row: dict[str, Any] = {"seed": seed}
    async with Grader() as grader:
        with tempfile.TemporaryDirectory() as name:
            folder = Path(name)
            task = Task(example_data(args, seed), folder)
            if before is None:
                before = await untrained(task, folder, grader)
                progress(seed, "untrained student", before)
            row["opd"] = await run_opd(task, folder, grader)
            progress(seed, "OPD", row["opd"])
            for peer in args.peers:
                gc.collect()  # the last arm's models (peft's modules hold cycles) go first
                row[peer] = await run_gold(
                    task, folder, grader, row["opd"]["step_seconds"], PEERS[peer]
                )
                progress(seed, ARM_NAMES[peer], row[peer])
    return before, row


def progress(seed: int, what: str, figures: dict[str, Any]) -> None:
    shown = {k: v for k, v in figures.items() if k != "examples"}
    print(f"  seed {seed}, {what}: {json.dumps(shown)}", flush=True)


def report(figures: dict[str, Any]) -> tuple[list[str], bool]:
    """The tables and the targets' lines; whether every target was met."""
    before, rows = figures["before"], figures["seeds"]
    arms = [arm for arm in ("opd", *PEERS) if all(arm in row for row in rows)]
    seeds = [r["seed"] for r in rows]
    head = table_head(seeds)

    def at(arm: str, *keys: str) -> list[float]:
        out = []
        for row in rows:
            value: Any = row[arm]
            for key in keys:
                value = value[key]
            out.append(value)
        return out

    def untrained_row(*keys: str) -> list[float]:
        value: Any = before
        for key in keys:
            value = value[key]
        return [value] * len(rows)

    settings = figures["settings"]
    lines = [
        f"teacher {settings['teacher']} reading the student's template (GOLD's case), greedy: "
        f"{before['teacher_on_student_template']:.1%}",
    ]
    for name in TEMPERATURES:
        lines += ["", f"held-out correctness, {name}, {settings['holdout']} problems", head]
        lines.append(table_line("untrained student", untrained_row(name, "correct"), ".1%"))
        lines += [table_line(ARM_NAMES[a], at(a, name, "correct"), ".1%") for a in arms]
        for operation in OPERATIONS.values():
            lines.append(
                table_line(f"  OPD, {operation}", at("opd", name, "by_operation", operation), ".1%")
            )
        lines.append("... answers that box a number")
        lines.append(table_line("untrained student", untrained_row(name, "boxed"), ".1%"))
        lines += [table_line(ARM_NAMES[a], at(a, name, "boxed"), ".1%") for a in arms]
    lines += [
        "",
        "what it keeps: reverse KL to the untrained base, general questions (nats/token)",
        head,
    ]
    lines.append(table_line("untrained student", untrained_row("general_kl"), ".3f"))
    lines += [table_line(ARM_NAMES[a], at(a, "general_kl"), ".3f") for a in arms]
    lines += ["", "wall time (s)", head]
    lines.append(table_line("OPD run (load, preflight, steps)", at("opd", "wall_seconds"), ".0f"))
    lines.append(table_line("OPD steps: the budget", at("opd", "step_seconds"), ".0f"))
    for arm in arms[1:]:
        lines.append(
            table_line(f"{arm} (its teacher's answers and steps)", at(arm, "wall_seconds"), ".0f")
        )
        lines.append(table_line(f"{arm} steps taken", [float(s) for s in at(arm, "steps")], ".0f"))
    opd = mean(at("opd", "greedy", "correct"))
    checks = [
        (
            f"OPD's held-out correctness (greedy) >= {TARGET_CORRECT:.0%} within "
            f"{TARGET_SECONDS / 60:.0f} minutes of the run",
            opd >= TARGET_CORRECT and mean(at("opd", "wall_seconds")) <= TARGET_SECONDS,
            f"{opd:.1%} in {mean(at('opd', 'wall_seconds')):.0f} s",
        )
    ]
    for arm in arms[1:]:
        theirs = mean(at(arm, "greedy", "correct"))
        checks.append(
            (f"OPD ahead of {ARM_NAMES[arm]} (greedy)", opd > theirs, f"{opd:.1%} vs {theirs:.1%}")
        )
    return targets(lines, checks)


def main() -> int:
    parser = benchmark_parser(__doc__, list(PEERS), "loop.steps=40")
    args = parser.parse_args()
    return benchmark_run(
        args,
        f"cross_family: {EXAMPLE.name} {' '.join(args.set)}, seeds {seed_range(args)}, peers "
        f"{' '.join(args.peers)}, {args.holdout} held-out problems",
        {
            "seeds": args.seeds,
            "set": args.set,
            "holdout": args.holdout,
            "teacher": yaml.safe_load(EXAMPLE.read_text())["teacher"]["base_model"],
        },
        run_all,
        report,
    )


if __name__ == "__main__":
    sys.exit(main())
