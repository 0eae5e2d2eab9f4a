"""A real model learns what its prompt said: SmolLM2-135M-Instruct trained by opd's
self-distillation (examples/smollm2-prompt-bake.yaml) beside supervised fine-tuning on the
prompted teacher's own samples (TRL's SFTTrainer), at equal wall time, graded alike.

    python benchmarks/real_model.py [--seeds 3] [--steps 10] [--objective reverse_kl]
                                    [--count 150] [--holdout 60] [--general 50]
                                    [--reference-seeds 1] [--json out.json]
                                    [--vllm http://127.0.0.1:8001/v1]
    python benchmarks/real_model.py --tables out.json   # the tables again, from the figures

Per seed (student.seed 1, 2, ...): opd's loop trains the example (the engine's `run_loop`
over the local backend, as `opd run` does, its in-loop eval left to the measure below), and
its steps' wall time (sampling, teacher scoring, training) is the budget SFT gets: the
prompted teacher (the base, adapter off, reading the system line and examples) answers each
training question once, then SFTTrainer trains the same LoRA (rank, init seed, learning
rate, 16 sequences a step) until the next step would pass the budget; sampling, tokenising
and training all count. Both students are then measured by the eval's own code on the same
held-out problems (never in the training pool, nor among the teacher's examples): format
compliance (a bare integer, the example's regex grader), the reverse KL to the prompted
teacher (per answer, as the targets read it, and per token), correctness (the stripped
answer is the reference) and the reverse KL to the untrained base on general questions
that need no number (what the student keeps). The untrained student is the same for every
seed (LoRA's B starts at zero, the eval's seed is fixed), so it and the prompted teacher
are measured once. The first --reference-seeds seeds also train with
`teacher.self.reference: true` (correctness, no target). The last lines check issue 38's
targets; the exit status is 1 when one is missed. With `--vllm URL` opd's rollouts sample on
that vLLM server (`sampling.engine: vllm`; `opd vllm serve smollm2-135m-instruct
--max-lora-rank 16` for the example's rank), measured alike by the local eval. See
benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, cast

import torch
import yaml
from datasets import Dataset
from transformers import PrinterCallback, TrainerCallback, TrainerControl, TrainerState
from trl import SFTConfig, SFTTrainer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from peers import cpu_name, trainer_settings

from kernel.spec import JobSpec
from worker.engine.backends.contract import ServiceClient
from worker.engine.backends.local import LocalServiceClient, LocalTrainingClient
from worker.engine.data.datasets import load_datasets
from worker.engine.data.mixing import Item, training_pools
from worker.engine.data.prompts import Prompts, as_chat
from worker.engine.eval.evaluation import Evaluation
from worker.engine.eval.grading import format_grader
from worker.engine.eval.prompts import load_eval_prompts
from worker.engine.loop.run import Run, close_teachers, eval_pools, evaluation_for, open_run
from worker.engine.loop.steps import run_loop
from worker.engine.rollouts.sampling import sample_and_score
from worker.engine.tracking.sinks import Sink

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "smollm2-prompt-bake.yaml"
GENERAL_QUESTIONS = [
    "What colour is the sky on a clear day?",
    "Name a fruit that is yellow.",
    "What is the capital of France?",
    "Who wrote Romeo and Juliet?",
    "What do bees make?",
    "Describe a cat in one sentence.",
    "What is the opposite of hot?",
    "Give me a synonym for happy.",
    "Which animal is known as the king of the jungle?",
    "What language is spoken in Spain?",
    "What do plants need to grow?",
    "Write a greeting for a friend.",
    "What is the largest ocean on Earth?",
    "Why do we wear coats in winter?",
    "What is the main ingredient of bread?",
    "Name a musical instrument with strings.",
    "What is the chemical symbol for gold?",
    "Suggest a name for a pet dog.",
    "What season comes after summer?",
    "How do you make a cup of tea?",
    "What is the boiling point of water called?",
    "Who painted the Mona Lisa?",
    "What does a doctor do?",
    "Name a planet in our solar system.",
    "What is the plural of mouse?",
    "Tell me a fun fact about elephants.",
    "What is the capital of Japan?",
    "What do you call a baby dog?",
    "Which gas do humans breathe in to live?",
    "Give an example of a vegetable.",
    "What is the weather like in a desert?",
    "How would you describe the taste of lemon?",
    "What is a verb?",
    "Name a famous scientist.",
    "What do cows drink?",
    "What is the colour of grass?",
    "Where does the sun rise?",
    "What is the past tense of run?",
    "Recommend a book for children.",
    "What is the job of the heart?",
    "Name something you find at the beach.",
    "What do you use to write on paper?",
    "What is snow made of?",
    "Who was the first person to walk on the Moon?",
    "What is a rainbow?",
    "Which continent is Egypt in?",
    "What is the opposite of early?",
    "Describe the smell of rain.",
    "What is a good way to stay healthy?",
    "Translate 'thank you' into French.",
]
"""Questions that need no number: the student should answer them as it did before."""
TARGET_GAP = 0.9
TARGET_SECONDS = 600.0
TARGET_KL_FALL = 0.5


class Keeping(LocalServiceClient):
    """The local backend, keeping the student it made, so its trained weights are measured
    after the loop returns."""

    student: LocalTrainingClient | None = None

    async def create_lora_training_client_async(
        self, base_model: str, rank: int = 32, seed: int | None = None
    ) -> LocalTrainingClient:
        self.student = await super().create_lora_training_client_async(base_model, rank, seed)
        return self.student


@dataclass(frozen=True)
class Reused:
    """A service whose student is a training client made already: `open_run` opens a
    spec's teachers over the very weights opd or TRL trained."""

    training: LocalTrainingClient

    async def create_lora_training_client_async(
        self, base_model: str, rank: int = 32, seed: int | None = None
    ) -> LocalTrainingClient:
        return self.training


class Graded:
    """The example's format grader, counting correctness too (the stripped answer is the
    reference answer) for each call: one sampling pass gives both."""

    def __init__(self, pattern: str) -> None:
        self.format = format_grader(pattern)
        self.correct: list[float] = []

    async def __call__(self, answers: list[str], references: list[str]) -> list[bool]:
        right = [a.strip() == r for a, r in zip(answers, references, strict=True)]
        self.correct.append(float(statistics.mean(right)))
        return await self.format(answers, references)


@dataclass
class Timing(Sink):
    """The steps' own wall time (sampling, teacher, training), as the loop reports it."""

    seconds: list[float] = field(default_factory=list)

    def step(self, step: int, metrics: dict[str, float]) -> None:
        self.seconds.append(metrics["time/step_elapsed_time"])


def example_data(args: argparse.Namespace, seed: int, reference: bool = False) -> dict[str, Any]:
    """The example's job with this run's seed, steps and held-out problems."""
    data = yaml.safe_load(EXAMPLE.read_text())
    data["student"]["seed"] = seed
    data["loop"]["steps"] = args.steps
    data["loop"]["objective"] = yaml.safe_load(args.objective)
    data["dataset"]["count"] = args.count
    data["eval"] |= {"holdout": args.holdout, "every": 0}
    data["teacher"]["self"]["reference"] = reference
    return data


def general_spec(data: dict[str, Any], count: int) -> JobSpec:
    """The example with the untrained base as its teacher (adapter off, no context) and
    the general questions as its eval: the eval's reverse KL is then the distance from
    what the student answered before."""
    general = json.loads(json.dumps(data))
    general["teacher"] = {"self": {"weights": "base"}}
    general["eval"] = {
        "dataset": {
            "source": "inline",
            "question_suffix": "",
            "prompts": GENERAL_QUESTIONS[:count],
        },
        "seed": general["eval"]["seed"],
    }
    return JobSpec.model_validate(general)


@dataclass(frozen=True)
class Task:
    """A seed's specs and prompts, loaded once for every run and measure of it."""

    spec: JobSpec
    general: JobSpec
    prompts: dict[str, Prompts]
    eval_prompts: dict[str, Prompts]
    general_prompts: dict[str, Prompts]

    @classmethod
    def load(cls, data: dict[str, Any], general: int, artifacts: Path) -> Task:
        spec = JobSpec.model_validate(data)
        general_spec_ = general_spec(data, general)
        prompts = load_datasets(spec, artifacts, False)
        eval_prompts = load_eval_prompts(spec, artifacts, False)
        held_out = {q for p in eval_prompts.values() for q in p.questions}
        trained = {q for p in prompts.values() for q in p.questions}
        examples = {e.user for e in spec.teacher.self.examples}  # type: ignore[union-attr]
        assert not held_out & (trained | examples), "held-out problems must be unseen"
        return cls(
            spec,
            general_spec_,
            prompts,
            eval_prompts,
            load_eval_prompts(general_spec_, artifacts, False),
        )


async def opened(spec: JobSpec, training: LocalTrainingClient, task: Task) -> Run:
    service = cast(ServiceClient, Reused(training))
    return await open_run(spec, service, Sink(), None, training_pools(spec, task.prompts))


async def measure(
    task: Task,
    training: LocalTrainingClient,
    steps: int,
    teacher: bool = False,
    general: bool = True,
) -> dict[str, float]:
    """The student's figures on the held-out problems and (`general`) the general
    questions, by the eval's own code (`steps`: the optimizer steps its weights took, which
    seed the eval's sampler as in a run); with `teacher`, the prompted teacher's answers too."""
    training.steps = steps
    run = await opened(task.spec, training, task)
    graded = Graded(cast(str, task.spec.eval.grader.regex))  # type: ignore[union-attr]
    evaluation = replace(
        evaluation_for(run, eval_pools(task.spec, task.eval_prompts), None), grade=graded
    )
    metrics = await run.evaluate(evaluation, 0 if teacher else steps)
    figures = {
        "compliance": metrics["eval/accuracy"],
        "correct": graded.correct[0],
        "reverse_kl": metrics["eval/reverse_kl_mean"],
        "tokens": metrics["eval/completion_tokens_mean"],
    }
    if teacher:
        figures |= {
            "teacher_compliance": metrics["eval/teacher_accuracy"],
            "teacher_correct": graded.correct[1],
            "teacher_tokens": metrics["eval/teacher_completion_tokens_mean"],
        }
    await close_teachers(run.teachers)
    if not general:
        return figures
    base = await opened(task.general, training, task)
    kept: Evaluation = evaluation_for(base, eval_pools(task.general, task.general_prompts), None)
    sampler = await training.save_weights_and_get_sampling_client_async()
    figures["general_kl"] = (await kept.student(sampler))["eval/reverse_kl_mean"]
    await close_teachers(base.teachers)
    return figures


async def run_opd(
    task: Task, artifacts: Path, general: bool = True, vllm: str | None = None
) -> dict[str, float]:
    """The example through opd's loop (its rollouts on the `vllm` server when given): its
    wall time in all (model load, preflight, steps) and its steps' own, then the trained
    student's figures (`general`: with what it keeps)."""
    service = Keeping(task.spec.local, artifacts)
    timing = Timing()
    spec, servers = task.spec, None
    if vllm is not None:
        sampling = spec.sampling.model_copy(update={"engine": "vllm"})
        spec, servers = (
            spec.model_copy(update={"sampling": sampling}),
            {spec.student.base_model: vllm},
        )
    started = time.perf_counter()
    await run_loop(spec, service, task.prompts, timing, vllm_servers=servers, job_folder=artifacts)
    wall = time.perf_counter() - started
    assert service.student is not None
    figures = await measure(task, service.student, task.spec.loop.steps, general=general)
    return figures | {"wall_seconds": wall, "step_seconds": sum(timing.seconds)}


class Budget(TrainerCallback):
    """Stops SFT when its next step (as long as its last) would pass the budget, which
    counts from `started` (the teacher's samples and the tokenising included)."""

    def __init__(self, started: float, seconds: float) -> None:
        self.started, self.seconds, self.last = started, seconds, started

    def on_train_begin(self, *_: Any, **__: Any) -> None:
        self.last = time.perf_counter()

    def on_step_end(
        self, args: Any, state: TrainerState, control: TrainerControl, **_: Any
    ) -> None:
        now = time.perf_counter()
        if 2 * now - self.last - self.started > self.seconds:  # now + (now - last)
            control.should_training_stop = True
        self.last = now


async def teacher_samples(task: Task, training: LocalTrainingClient) -> list[tuple[str, str]]:
    """Each training question and the prompted teacher's answer to it, sampled as opd's
    rollouts are (the spec's temperature and tokens, the chat's stop)."""
    run = await opened(task.spec, training, task)
    items = [
        Item(prompt, answer, pool)
        for pool in training_pools(task.spec, task.prompts)
        for prompt, answer in zip(pool.prompts.prompts, pool.prompts.answers, strict=True)
    ]
    sampler = await training.save_weights_and_get_sampling_client_async()
    answerers = [
        run.answerer(item, run.render(item.prompt, item.pool.options), sampler) for item in items
    ]
    scorers = [a.scorer for a in answerers]
    batch = await sample_and_score(
        scorers[0].client,
        scorers,
        [s.prompt for s in scorers],
        1,
        run.params,
        scored=False,
    )
    await close_teachers(run.teachers)
    return [
        (
            as_chat(items[c.group].prompt, items[c.group].pool.options).messages[-1].text(),
            run.decode(c.tokens),
        )
        for c in batch.completions
    ]


async def run_sft(
    task: Task, artifacts: Path, budget: float, before: dict[str, float] | None
) -> tuple[dict[str, float], dict[str, float]]:
    """SFT on the prompted teacher's samples for `budget` seconds of wall time, sampling
    included; the untrained student's figures first unless `before` has them."""
    spec = task.spec
    service = LocalServiceClient(spec.local, artifacts)
    training = await service.create_lora_training_client_async(
        spec.student.base_model, spec.student.lora_rank, spec.student.seed
    )
    if before is None:
        before = await measure(task, training, 0, teacher=True)
    started = time.perf_counter()
    samples = await teacher_samples(task, training)
    sampled = time.perf_counter() - started
    dataset = Dataset.from_dict(
        {
            "prompt": [[{"role": "user", "content": q}] for q, _ in samples],
            "completion": [[{"role": "assistant", "content": a}] for _, a in samples],
        }
    )
    config = SFTConfig(
        output_dir=str(artifacts / "sft"),
        per_device_train_batch_size=spec.loop.batch_size * spec.loop.group_size,
        max_steps=10_000,  # the budget stops it
        learning_rate=spec.optim.learning_rate,
        lr_scheduler_type="constant",
        seed=spec.student.seed,
        **trainer_settings(),
    )
    trainer = SFTTrainer(
        model=training.model,
        args=config,
        train_dataset=dataset,
        processing_class=training.tokenizer,
        callbacks=[Budget(started, budget)],
    )
    trainer.remove_callback(PrinterCallback)

    def train() -> None:
        torch.set_num_threads(spec.local.cpu_threads)  # per thread, as the local runner does
        trainer.train()

    await asyncio.to_thread(train)
    wall = time.perf_counter() - started
    steps = trainer.state.global_step
    after = await measure(task, training, steps)
    return after | {"wall_seconds": wall, "sample_seconds": sampled, "steps": steps}, before


async def run_all(args: argparse.Namespace, figures: dict[str, Any]) -> None:
    """Every seed's OPD, SFT and (the first --reference-seeds) reference runs, added to
    `figures` seed by seed (and written to --json after each, so a long run cut short
    keeps its finished seeds)."""
    for seed in range(1, args.seeds + 1):
        row: dict[str, Any] = {"seed": seed}
        with tempfile.TemporaryDirectory() as folder:
            artifacts = Path(folder)
            task = Task.load(example_data(args, seed), args.general, artifacts)
            row["opd"] = await run_opd(task, artifacts, vllm=args.vllm)
            progress(seed, "OPD", row["opd"])
            row["sft"], figures["before"] = await run_sft(
                task, artifacts, row["opd"]["step_seconds"], figures["before"]
            )
            progress(seed, "untrained student and prompted teacher", figures["before"])
            progress(seed, "SFT", row["sft"])
            if seed <= args.reference_seeds:
                referenced = Task.load(example_data(args, seed, True), args.general, artifacts)
                row["reference"] = await run_opd(
                    referenced, artifacts, general=False, vllm=args.vllm
                )
                progress(seed, "reference: true", row["reference"])
        figures["seeds"].append(row)
        if args.json:
            args.json.write_text(json.dumps(figures, indent=2))


def progress(seed: int, what: str, figures: dict[str, float]) -> None:
    shown = ", ".join(f"{k} {v:.3g}" for k, v in figures.items())
    print(f"  seed {seed}, {what}: {shown}", flush=True)


def gap_closed(after: float, before: float, teacher: float) -> float:
    return (after - before) / (teacher - before) if teacher != before else math.nan


def per_answer(figures: dict[str, float]) -> float:
    """The reverse KL summed over an answer's tokens, the mean over answers: the
    sequence-level divergence the sampled reverse KL estimates (the eval's per-token mean
    times the mean answer length, exactly). The per-token mean alone changes meaning when
    the answers shrink from 20 tokens of prose to a number."""
    return figures["reverse_kl"] * figures["tokens"]


def mean(values: list[float]) -> float:
    return statistics.mean(values) if values else math.nan


def report(figures: dict[str, Any]) -> tuple[list[str], bool]:
    """The tables and the targets' lines; whether every target was met."""
    before, rows = figures["before"], figures["seeds"]
    seeds = [r["seed"] for r in rows]
    width = 44
    head = f"{'':<{width}}" + "".join(f"{'seed ' + str(s):>10}" for s in seeds) + f"{'mean':>10}"

    def line(label: str, values: list[float], style: str) -> str:
        cells = [format(v, style) for v in values]
        return (
            f"{label:<{width}}" + "".join(f"{c:>10}" for c in cells) + f"{mean(values):>10{style}}"
        )

    def side(name: str, key: str) -> list[float]:
        return [r[name][key] for r in rows]

    every = [before[k] for k in ("compliance",)] * len(rows)
    teacher = [before["teacher_compliance"]] * len(rows)
    settings = figures["settings"]
    lines = [
        f"opd: {settings['steps']} steps of {settings['objective']}; SFT: TRL's SFTTrainer for "
        "as long",
        "",
        f"held-out format compliance (a bare integer), {settings['holdout']} problems",
        head,
    ]
    lines.append(line("untrained student", every, ".1%"))
    lines.append(line("prompted teacher", teacher, ".1%"))
    lines.append(line("OPD", side("opd", "compliance"), ".1%"))
    lines.append(line("SFT, equal wall time", side("sft", "compliance"), ".1%"))
    opd_gap = [
        gap_closed(r["opd"]["compliance"], before["compliance"], before["teacher_compliance"])
        for r in rows
    ]
    sft_gap = [
        gap_closed(r["sft"]["compliance"], before["compliance"], before["teacher_compliance"])
        for r in rows
    ]
    lines.append(line("gap closed, OPD", opd_gap, ".0%"))
    lines.append(line("gap closed, SFT", sft_gap, ".0%"))
    lines += ["", "held-out reverse KL to the prompted teacher, per answer (nats)", head]
    lines.append(line("untrained student", [per_answer(before)] * len(rows), ".2f"))
    opd_kl, sft_kl = [per_answer(r["opd"]) for r in rows], [per_answer(r["sft"]) for r in rows]
    lines.append(line("OPD", opd_kl, ".2f"))
    lines.append(line("SFT", sft_kl, ".2f"))
    lines.append("... per token (eval/reverse_kl_mean)")
    lines.append(line("untrained student", [before["reverse_kl"]] * len(rows), ".3f"))
    lines.append(line("OPD", side("opd", "reverse_kl"), ".3f"))
    lines.append(line("SFT", side("sft", "reverse_kl"), ".3f"))
    lines.append("... the answers' length (tokens)")
    lines.append(line("untrained student", [before["tokens"]] * len(rows), ".1f"))
    lines.append(line("prompted teacher", [before["teacher_tokens"]] * len(rows), ".1f"))
    lines.append(line("OPD", side("opd", "tokens"), ".1f"))
    lines.append(line("SFT", side("sft", "tokens"), ".1f"))
    general = settings["general"]
    lines += [
        "",
        f"what it keeps: reverse KL to the untrained base, {general} general questions "
        "(nats/token)",
        head,
    ]
    lines.append(line("untrained student", [before["general_kl"]] * len(rows), ".3f"))
    lines.append(line("OPD", side("opd", "general_kl"), ".3f"))
    lines.append(line("SFT", side("sft", "general_kl"), ".3f"))
    lines += ["", "wall time (s)", head]
    lines.append(line("OPD run (load, preflight, steps)", side("opd", "wall_seconds"), ".0f"))
    lines.append(line("OPD steps: the budget", side("opd", "step_seconds"), ".0f"))
    lines.append(
        line("SFT (teacher samples, tokenising, steps)", side("sft", "wall_seconds"), ".0f")
    )
    lines.append(line("  of which the teacher's samples", side("sft", "sample_seconds"), ".0f"))
    lines.append(line("SFT steps taken", [float(s) for s in side("sft", "steps")], ".0f"))
    lines += ["", "held-out correctness (the answer is the reference)", head]
    lines.append(line("untrained student", [before["correct"]] * len(rows), ".1%"))
    lines.append(line("prompted teacher", [before["teacher_correct"]] * len(rows), ".1%"))
    lines.append(line("OPD", side("opd", "correct"), ".1%"))
    lines.append(line("SFT", side("sft", "correct"), ".1%"))
    referenced = [r for r in rows if "reference" in r]
    for r in referenced:
        ref = r["reference"]
        lines.append(
            f"reference: true, seed {r['seed']}: compliance {ref['compliance']:.1%}, "
            f"correctness {ref['correct']:.1%} (untrained {before['correct']:.1%})"
        )
    checks = [
        (
            f"compliance closes >= {TARGET_GAP:.0%} of the gap within {TARGET_SECONDS / 60:.0f} "
            "minutes of the run (load and steps)",
            mean(opd_gap) >= TARGET_GAP and mean(side("opd", "wall_seconds")) <= TARGET_SECONDS,
            f"{mean(opd_gap):.0%} in {mean(side('opd', 'wall_seconds')):.0f} s",
        ),
        (
            f"held-out reverse KL per answer falls by at least {TARGET_KL_FALL:.0%}",
            mean(opd_kl) <= TARGET_KL_FALL * per_answer(before),
            f"{per_answer(before):.2f} -> {mean(opd_kl):.2f} nats",
        ),
        (
            "OPD >= SFT on compliance at equal wall time",
            mean(side("opd", "compliance")) >= mean(side("sft", "compliance")),
            f"{mean(side('opd', 'compliance')):.1%} vs {mean(side('sft', 'compliance')):.1%}",
        ),
        (
            "OPD <= SFT on held-out reverse KL per answer at equal wall time",
            mean(opd_kl) <= mean(sft_kl),
            f"{mean(opd_kl):.2f} vs {mean(sft_kl):.2f} nats",
        ),
    ]
    lines.append("")
    lines += [
        f"target: {what}: {'met' if ok else 'NOT met'} ({shown})" for what, ok, shown in checks
    ]
    return lines, all(ok for _, ok, _ in checks)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3, help="student.seed 1..N")
    parser.add_argument("--steps", type=int, default=10, help="opd's steps")
    parser.add_argument(
        "--objective",
        default=str(yaml.safe_load(EXAMPLE.read_text())["loop"]["objective"]),
        help="opd's loop.objective (YAML); default: the example's",
    )
    parser.add_argument("--count", type=int, default=150, help="problems in the training pool")
    parser.add_argument("--holdout", type=int, default=60, help="held-out problems")
    parser.add_argument("--general", type=int, default=len(GENERAL_QUESTIONS))
    parser.add_argument("--reference-seeds", type=int, default=1)
    parser.add_argument("--json", type=Path, help="keep every figure in this file")
    parser.add_argument("--tables", type=Path, help="print a --json file's tables, run nothing")
    parser.add_argument("--vllm", help="opd's rollouts on this vLLM server (its /v1 URL)")
    args = parser.parse_args()
    if args.tables:
        lines, met = report(json.loads(args.tables.read_text()))
        print("\n".join(lines))
        return 0 if met else 1
    warnings.filterwarnings("ignore", category=FutureWarning)
    load = os.getloadavg()[0]
    print(
        f"real_model: {EXAMPLE.name}, {args.steps} steps of {args.objective}, seeds "
        f"1..{args.seeds}, {args.holdout} held-out problems, {args.general} general "
        f"questions; {cpu_name()}, {os.cpu_count()} CPUs, load average {load:.2f}",
        flush=True,
    )
    started = time.perf_counter()
    figures: dict[str, Any] = {
        "settings": {
            "seeds": args.seeds,
            "steps": args.steps,
            "objective": args.objective,
            "count": args.count,
            "holdout": args.holdout,
            "general": args.general,
            "reference_seeds": args.reference_seeds,
            "engine": "vllm" if args.vllm else "local",
            "machine": f"{cpu_name()}, {os.cpu_count()} CPUs",
            "load_average": [load],
        },
        "before": None,
        "seeds": [],
    }
    asyncio.run(run_all(args, figures))
    figures["settings"]["load_average"].append(os.getloadavg()[0])
    figures["settings"]["seconds"] = time.perf_counter() - started
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    lines, met = report(figures)
    print("\n" + "\n".join(lines))
    print(
        f"\n{figures['settings']['seconds']:.0f} s in all; load average {load:.2f} at the "
        f"start, {os.getloadavg()[0]:.2f} at the end"
    )
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
