"""A real model learns what its prompt said and keeps what it knew: SmolLM2-135M-Instruct
trained by opd's self-distillation (examples/smollm2-prompt-bake.yaml: the prompted base
teaches the format on arithmetic, the base as it was teaches everyday prompts) beside what a
user would pick instead, TRL 1.16's SFTTrainer and SDFTTrainer, at equal wall time, graded
alike.

    python benchmarks/real_model.py [--seeds 3] [--peers sft sdft] [--steps 10]
                                    [--objective reverse_kl] [--set loop.batch_size=16 ...]
                                    [--holdout 60] [--answers 4] [--general 100]
                                    [--json out.json] [--untrained kept.json]
                                    [--vllm http://127.0.0.1:8001/v1]
    python benchmarks/real_model.py --tables out.json [more.json ...]   # the tables again

Per seed (student.seed 1, 2, ...): opd's loop trains the example (the engine's `run_loop`
over the local backend, as `opd run` does, its in-loop eval left to the measure below), and
its steps' wall time (sampling, teacher scoring, training) is the budget each peer gets:
SFT: the prompted teacher (the base, adapter off, reading the system line and examples)
answers each arithmetic training question once, then SFTTrainer trains the same LoRA (rank,
init seed, learning rate, 16 sequences a step) until the next step would pass the budget;
SDFT: SDFTTrainer (its defaults: top-100 logit distillation from the base, `teacher_model_kind:
base`) samples the student on the same questions and distils the base reading the same system
line and examples (its privileged context, in the same chat turns). Sampling, tokenising and
training all count. Every student is then measured by the eval's own code: on held-out
arithmetic problems (never in the training pool, nor among the teacher's examples; each
answered --answers times) its format compliance (a bare integer, the example's regex
grader), its reverse KL to the prompted teacher (per answer: the mean, the median and the
share the answers that are not a bare number carry; and per token) and its correctness;
and what it keeps: the reverse KL to the untrained base on 100 general questions that need
no number (none of them in the example's everyday prompts), and the share of simple facts
the base answers right (greedy, the expected word in its answer) that it still answers
right. The untrained student is the same for every seed (LoRA's B starts at zero, the
eval's seed is fixed), so it and the prompted teacher are measured once (or taken from a
kept run: --untrained). The last lines check issue 46's targets; the exit status is 1 when
one is missed. With `--vllm URL` opd's rollouts sample on that vLLM server. See
benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import math
import multiprocessing
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import torch
import yaml
from datasets import Dataset
from pytrio.types import ModelInput
from transformers import PrinterCallback, TrainerCallback, TrainerControl, TrainerState
from trl import SFTConfig, SFTTrainer
from trl.experimental.sdft import SDFTConfig, SDFTTrainer
from trl.experimental.sdft.sdft_trainer import DemonstrationTeacherContextBuilder

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from learning import set_setting
from peers import cpu_name, trainer_settings

from kernel.chats.conversation import Conversation
from kernel.spec import JobSpec
from worker.engine.backends.contract import ServiceClient
from worker.engine.backends.local import LocalServiceClient, LocalTrainingClient
from worker.engine.data.datasets import load_datasets
from worker.engine.data.mixing import Item, training_pools
from worker.engine.data.prompts import Prompts, question_text
from worker.engine.eval.evaluation import Evaluation
from worker.engine.eval.grading import format_grader
from worker.engine.eval.prompts import load_eval_prompts
from worker.engine.loop.run import Run, close_teachers, eval_pools, evaluation_for, open_run
from worker.engine.loop.steps import run_loop
from worker.engine.rollouts.sampling import Batch, sample_and_score
from worker.engine.teachers.views import in_context
from worker.engine.tracking.sinks import Sink

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "smollm2-prompt-bake.yaml"
LEARNED, TASK = "prompted", "arithmetic"
"""The example's teacher of the format and the dataset it teaches on."""
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
    "What is the capital of England?",
    "Name a color that is made by mixing blue and yellow.",
    "Why do we wear sunglasses?",
    "Write a short invitation to a picnic.",
    "What does a teacher do?",
    "Describe a snowy morning in one sentence.",
    "What is the opposite of cold?",
    "Give me a synonym for quick.",
    "Which animal is the largest on Earth?",
    "What language is spoken in Germany?",
    "How do you plant a seed?",
    "Suggest a name for a goldfish.",
    "What is the smallest planet in our solar system?",
    "Why do we wash our hands?",
    "What is cheese made from?",
    "Name an instrument with black and white keys.",
    "What is the chemical symbol for oxygen?",
    "What do you call a baby horse?",
    "Which season has the longest days?",
    "How do you make pancakes?",
    "Who wrote Hamlet?",
    "What does a dentist do?",
    "Name a country in South America.",
    "What is the plural of goose?",
    "Tell me a fun fact about penguins.",
    "What is the capital of Australia?",
    "What do frogs eat?",
    "Which organ pumps blood around the body?",
    "Give an example of a green vegetable.",
    "What is the weather like in a rainforest?",
    "How would you describe the taste of sugar?",
    "What is an adjective?",
    "Name a famous composer.",
    "What do rabbits eat?",
    "What colour is an orange?",
    "Where do penguins live?",
    "What is the past tense of swim?",
    "Recommend a hobby for a rainy day.",
    "What is the job of the stomach?",
    "Name something you find in a classroom.",
    "What do you use to take a photo?",
    "What are clouds made of?",
    "Who discovered gravity?",
    "What is an ocean?",
    "Which continent is India in?",
    "What is the opposite of loud?",
    "Describe the smell of fresh bread.",
    "What is a good way to make friends?",
    "Translate 'please' into French.",
    "Write a one-line description of summer.",
]
FACTS = [
    ("What is the capital of France?", "Paris"),
    ("What is the capital of Japan?", "Tokyo"),
    ("What is the capital of Italy?", "Rome"),
    ("What is the capital of Germany?", "Berlin"),
    ("What is the capital of Spain?", "Madrid"),
    ("What is the capital of England?", "London"),
    ("What is the capital of Russia?", "Moscow"),
    ("What is the capital of China?", "Beijing"),
    ("What is the capital of Egypt?", "Cairo"),
    ("What is the capital of Greece?", "Athens"),
    ("What is the capital of Canada?", "Ottawa"),
    ("What is the capital of Ireland?", "Dublin"),
    ("What is the capital of Portugal?", "Lisbon"),
    ("What is the capital of Austria?", "Vienna"),
    ("What is the capital of Norway?", "Oslo"),
    ("Who wrote Romeo and Juliet?", "Shakespeare"),
    ("Who wrote Hamlet?", "Shakespeare"),
    ("Who painted the Mona Lisa?", "Vinci"),
    ("Who discovered gravity?", "Newton"),
    ("Who developed the theory of relativity?", "Einstein"),
    ("Who was the first person to walk on the Moon?", "Armstrong"),
    ("Who invented the light bulb?", "Edison"),
    ("Who invented the telephone?", "Bell"),
    ("What is the largest planet in our solar system?", "Jupiter"),
    ("Which planet is known as the red planet?", "Mars"),
    ("What is the closest star to Earth?", "Sun"),
    ("What is the largest ocean on Earth?", "Pacific"),
    ("What is the tallest mountain in the world?", "Everest"),
    ("What is the longest river in Africa?", "Nile"),
    ("What is the largest desert in the world?", "Sahara"),
    ("Which continent is Egypt in?", "Africa"),
    ("Which continent is Brazil in?", "South America"),
    ("Which continent is France in?", "Europe"),
    ("What do bees make?", "honey"),
    ("What do cows drink?", "water"),
    ("What do cows produce that people drink?", "milk"),
    ("What gas do humans breathe in to live?", "oxygen"),
    ("What gas do plants take in from the air?", "carbon dioxide"),
    ("What is the chemical symbol for gold?", "Au"),
    ("What is the chemical symbol for water?", "H2O"),
    ("What is frozen water called?", "ice"),
    ("What is the colour of grass?", "green"),
    ("What colour is the sky on a clear day?", "blue"),
    ("What colour is a banana?", "yellow"),
    ("What colour is snow?", "white"),
    ("What is the opposite of hot?", "cold"),
    ("What is the opposite of up?", "down"),
    ("What is the opposite of day?", "night"),
    ("What is the opposite of big?", "small"),
    ("What is the plural of mouse?", "mice"),
    ("What is the plural of child?", "children"),
    ("What is the past tense of run?", "ran"),
    ("What is the past tense of eat?", "ate"),
    ("What is the past tense of go?", "went"),
    ("What do you call a baby dog?", "puppy"),
    ("What do you call a baby cat?", "kitten"),
    ("What do you call a baby cow?", "calf"),
    ("Which animal is known as the king of the jungle?", "lion"),
    ("Which animal has a trunk?", "elephant"),
    ("Which bird is a symbol of peace?", "dove"),
    ("What language is spoken in Spain?", "Spanish"),
    ("What language is spoken in France?", "French"),
    ("What language is spoken in Germany?", "German"),
    ("What language is spoken in Brazil?", "Portuguese"),
    ("Which organ pumps blood around the body?", "heart"),
    ("Which organ do we use to breathe?", "lungs"),
    ("How many legs does a spider have?", "eight"),
    ("How many days are in a week?", "seven"),
    ("How many continents are there?", "seven"),
    ("What season comes after summer?", "autumn"),
    ("What is the main ingredient of bread?", "flour"),
    ("What fruit is used to make wine?", "grape"),
    ("What is the hardest natural substance?", "diamond"),
    ("What is the boiling point of water in Celsius?", "100"),
    ("What is the freezing point of water in Celsius?", "0"),
    ("Translate 'thank you' into French.", "merci"),
    ("Translate 'hello' into Spanish.", "hola"),
    ("What is the largest animal on Earth?", "whale"),
    ("What do caterpillars turn into?", "butterfl"),
    ("Where does the sun rise?", "east"),
]
"""GENERAL_QUESTIONS: questions that need no number, none of them among the example's
everyday prompts: the student should answer them as it did before. FACTS: simple questions
and a word the right answer holds; the base's right ones should stay right."""
ARMS = ("opd", "sft", "sdft")
ARM_NAMES = {"opd": "OPD", "sft": "SFT (TRL SFTTrainer)", "sdft": "SDFT (TRL SDFTTrainer)"}
TARGET_COMPLIANCE = 0.95
TARGET_DRIFT_OF_SFT = 0.5


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
        self.answers: list[list[str]] = []
        self.bare: list[list[bool]] = []

    async def __call__(self, answers: list[str], references: list[str]) -> list[bool]:
        right = [a.strip() == r for a, r in zip(answers, references, strict=True)]
        self.correct.append(float(statistics.mean(right)))
        self.answers.append(answers)
        self.bare.append(await self.format(answers, references))
        return self.bare[-1]


@dataclass
class PerAnswer(Evaluation):
    """The eval, keeping each of the student's answers' reverse KL (summed over its
    tokens): the eval reports only the mean, which one unlikely answer can carry."""

    answer_kls: list[float] = field(default_factory=list)
    answer_logprobs: list[float] = field(default_factory=list)
    """The student's logprob of each answer: how sure it was of what it wrote."""

    async def student_figures(self, batch: Batch) -> dict[str, float]:
        self.answer_kls = [float(c.reverse_kl.sum()) for c in batch.completions]
        self.answer_logprobs = [float(sum(c.student_logprobs)) for c in batch.completions]
        return await super().student_figures(batch)


@dataclass
class Timing(Sink):
    """The steps' own wall time (sampling, teacher, training), as the loop reports it."""

    seconds: list[float] = field(default_factory=list)

    def step(self, step: int, metrics: dict[str, float]) -> None:
        self.seconds.append(metrics["time/step_elapsed_time"])


def example_data(args: argparse.Namespace, seed: int) -> dict[str, Any]:
    """The example's job with this run's seed, steps, objective and settings."""
    data = yaml.safe_load(EXAMPLE.read_text())
    data["student"]["seed"] = seed
    data["loop"]["steps"] = args.steps
    data["loop"]["objective"] = yaml.safe_load(args.objective)
    data["eval"] |= {"every": 0}
    for setting in args.set:
        key, value = setting.split("=", 1)
        set_setting(data, key, yaml.safe_load(value))
    return data


def measured_data(data: dict[str, Any], holdout: int, answers: int = 1) -> dict[str, Any]:
    """The example's format task alone: its arithmetic dataset, taught by its prompted
    teacher, with `holdout` problems held out, each answered `answers` times; what every
    student is measured on and what the peers train on."""
    measured = json.loads(json.dumps(data))
    [arithmetic] = [d for d in measured.pop("datasets") if d["name"] == TASK]
    measured["dataset"] = {
        k: v for k, v in arithmetic.items() if k not in ("name", "teacher", "weight")
    }
    measured["teacher"] = measured.pop("teachers")[LEARNED]
    measured.pop("teacher_mixture")
    measured["eval"] |= {"holdout": holdout, "every": 0, "samples_per_prompt": answers}
    return measured


def general_spec(data: dict[str, Any], count: int) -> JobSpec:
    """The format task with the untrained base as its teacher (adapter off, no context)
    and the general questions as its eval: the eval's reverse KL is then the distance from
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
    """A seed's specs and prompts, loaded once for every run and measure of it: the
    example as opd trains it (`spec`, `prompts`), the format task every student is
    measured on and the peers train on (`measured`), and the general questions."""

    spec: JobSpec
    prompts: dict[str, Prompts]
    measured: JobSpec
    measured_prompts: dict[str, Prompts]
    eval_prompts: dict[str, Prompts]
    general: JobSpec
    general_prompts: dict[str, Prompts]

    @classmethod
    def load(cls, data: dict[str, Any], args: argparse.Namespace, folder: Path) -> Task:
        """`folder`: the data root, where the example's files are copied (its datasets'
        cache goes there, not into the repository)."""
        spec = JobSpec.model_validate(data)
        measured = JobSpec.model_validate(measured_data(data, args.holdout, args.answers))
        general = general_spec(measured_data(data, args.holdout), args.general)
        shutil.copytree(ROOT / "examples" / "data", folder / "examples" / "data")
        prompts = load_datasets(spec, folder, False)
        measured_prompts = load_datasets(measured, folder, False)
        eval_prompts = load_eval_prompts(measured, folder, False)
        held_out = {q for p in eval_prompts.values() for q in p.prompts}
        trained = {q for p in prompts.values() for q in p.prompts}
        examples = {e.user for e in measured.teacher.self.examples}  # type: ignore[union-attr]
        assert not held_out & (trained | examples), "held-out problems must be unseen"
        asked = set(GENERAL_QUESTIONS) | {question for question, _ in FACTS}
        everyday = [
            json.loads(line)["question"] for line in everyday_file(spec).read_text().splitlines()
        ]
        assert not asked & set(everyday), (
            "the general questions must be none of the everyday prompts"
        )
        return cls(
            spec,
            prompts,
            measured,
            measured_prompts,
            eval_prompts,
            general,
            load_eval_prompts(general, folder, False),
        )


def everyday_file(spec: JobSpec) -> Path:
    """The example's everyday prompts (its file dataset)."""
    [everyday] = [d for d in spec.dataset_shares() if getattr(d, "path", None)]
    return ROOT / everyday.path  # type: ignore[union-attr]


async def opened(spec: JobSpec, training: LocalTrainingClient, prompts: dict[str, Prompts]) -> Run:
    service = cast(ServiceClient, Reused(training))
    return await open_run(spec, service, Sink(), None, training_pools(spec, prompts))


async def measure(
    task: Task,
    training: LocalTrainingClient,
    steps: int,
    teacher: bool = False,
) -> dict[str, Any]:
    """The student's figures by the eval's own code (`steps`: the optimizer steps its
    weights took, which seed the eval's sampler as in a run): on the held-out problems, on
    the general questions and on the facts; with `teacher`, the prompted teacher's answers
    to the problems too."""
    training.steps = steps
    run = await opened(task.measured, training, task.measured_prompts)
    graded = Graded(cast(str, task.measured.eval.grader.regex))  # type: ignore[union-attr]
    evaluated = evaluation_for(run, eval_pools(task.measured, task.eval_prompts), None)
    evaluation = PerAnswer(**vars(evaluated) | {"grade": graded})
    metrics = await run.evaluate(evaluation, 0 if teacher else steps)
    figures: dict[str, Any] = {
        "compliance": metrics["eval/accuracy"],
        "correct": graded.correct[0],
        "reverse_kl": metrics["eval/reverse_kl_mean"],
        "tokens": metrics["eval/completion_tokens_mean"],
        "answers": [
            {"text": text, "kl": kl, "logprob": logprob, "bare": bare}
            for text, kl, logprob, bare in zip(
                graded.answers[0],
                evaluation.answer_kls,
                evaluation.answer_logprobs,
                graded.bare[0],
                strict=True,
            )
        ],
    }
    if teacher:
        figures |= {
            "teacher_compliance": metrics["eval/teacher_accuracy"],
            "teacher_correct": graded.correct[1],
            "teacher_tokens": metrics["eval/teacher_completion_tokens_mean"],
        }
    await close_teachers(run.teachers)
    base = await opened(task.general, training, task.measured_prompts)
    kept: Evaluation = evaluation_for(base, eval_pools(task.general, task.general_prompts), None)
    sampler = await training.save_weights_and_get_sampling_client_async()
    figures["general_kl"] = (await kept.student(sampler))["eval/reverse_kl_mean"]
    figures["facts"] = await facts_right(base, sampler)
    await close_teachers(base.teachers)
    return figures


FACT_TOKENS = 32


async def facts_right(run: Run, sampler: Any) -> list[bool]:
    """Whether each fact's greedy answer (`FACT_TOKENS` at most) holds its word."""
    options = task_options(run)
    params = run.params.model_copy(update={"temperature": 0.0, "max_tokens": FACT_TOKENS})

    async def answer(question: str) -> str:
        prompt = ModelInput.from_ints(run.render(question, options))
        response = await sampler.sample_async(prompt=prompt, num_samples=1, sampling_params=params)
        return run.decode(list(response.sequences[0].tokens))

    answers = await asyncio.gather(*(answer(question) for question, _ in FACTS))
    return [word.lower() in text.lower() for (_, word), text in zip(FACTS, answers, strict=True)]


def task_options(run: Run) -> Any:
    return run.spec.dataset_shares()[0]


async def run_opd(task: Task, artifacts: Path, vllm: str | None = None) -> dict[str, Any]:
    """The example through opd's loop (its rollouts on the `vllm` server when given): its
    wall time in all (model load, preflight, steps) and its steps' own, then the trained
    student's figures."""
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
    figures = await measure(task, service.student, task.spec.loop.steps)
    return figures | {"wall_seconds": wall, "step_seconds": sum(timing.seconds)}


class Budget(TrainerCallback):
    """Stops a peer when its next step (as long as its last) would pass the budget, which
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
    run = await opened(task.measured, training, task.measured_prompts)
    items = [
        Item(question, answer, pool)
        for pool in training_pools(task.measured, task.measured_prompts)
        for question, answer in zip(pool.prompts.prompts, pool.prompts.answers, strict=True)
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
            question_text(str(items[c.group].prompt), items[c.group].pool.options.question_suffix),
            run.decode(c.tokens),
        )
        for c in batch.completions
    ]


def training_questions(task: Task) -> list[str]:
    """The format task's training questions as the student reads them."""
    return [
        question_text(str(question), pool.options.question_suffix)
        for pool in training_pools(task.measured, task.measured_prompts)
        for question in pool.prompts.prompts
    ]


async def a_peer(
    task: Task,
    artifacts: Path,
    budget: float,
    trainer_of: Callable[[LocalTrainingClient, Budget, Any], Any],
    prepare: Callable[[LocalTrainingClient], Any] | None = None,
) -> tuple[LocalTrainingClient, dict[str, float]]:
    """A TRL trainer (`trainer_of`: from the student's training client and the budget's
    callback) training the same LoRA as opd for `budget` seconds of wall time, counted
    from before `prepare` (the teacher's samples, for SFT); its steps taken and time."""
    spec = task.measured
    service = LocalServiceClient(spec.local, artifacts)
    training = await service.create_lora_training_client_async(
        spec.student.base_model, spec.student.lora_rank, spec.student.seed
    )
    started = time.perf_counter()
    prepared = await prepare(training) if prepare is not None else None
    sampled = time.perf_counter() - started
    trainer = trainer_of(training, Budget(started, budget), prepared)
    trainer.remove_callback(PrinterCallback)

    def train() -> None:
        torch.set_num_threads(spec.local.cpu_threads)  # per thread, as the local runner does
        trainer.train()

    await asyncio.to_thread(train)
    wall = time.perf_counter() - started
    steps = trainer.state.global_step
    return training, {"wall_seconds": wall, "sample_seconds": sampled, "steps": steps}


def peer_config(task: Task) -> dict[str, Any]:
    """What every TRL peer is told as opd is: 16 sequences a step, the learning rate and
    its constant schedule, the seed; the budget stops it."""
    spec = task.measured
    return {
        "per_device_train_batch_size": spec.loop.batch_size * spec.loop.group_size,
        "max_steps": 10_000,
        "learning_rate": spec.optim.learning_rate,
        "lr_scheduler_type": "constant",
        "seed": spec.student.seed,
        **trainer_settings(),
    }


async def run_sft(task: Task, artifacts: Path, budget: float) -> dict[str, float]:
    """SFT on the prompted teacher's samples for `budget` seconds of wall time, sampling
    included."""

    def trainer(training: LocalTrainingClient, stop: Budget, samples: Any) -> SFTTrainer:
        dataset = Dataset.from_dict(
            {
                "prompt": [[{"role": "user", "content": q}] for q, _ in samples],
                "completion": [[{"role": "assistant", "content": a}] for _, a in samples],
            }
        )
        config = SFTConfig(output_dir=str(artifacts / "sft"), **peer_config(task))
        return SFTTrainer(
            model=training.model,
            args=config,
            train_dataset=dataset,
            processing_class=training.tokenizer,
            callbacks=[stop],
        )

    training, took = await a_peer(
        task, artifacts, budget, trainer, lambda training: teacher_samples(task, training)
    )
    return await measure(task, training, int(took["steps"])) | took


class ContextTurns(DemonstrationTeacherContextBuilder):
    """SDFT's teacher prompt as opd's self teacher reads it: the context's chat turns (its
    system line, its example turns), then the student's prompt, instead of TRL's default
    text template ("{prompt}\n\n{privileged_context}" in one user turn)."""

    def __init__(self, trainer: Any, turns: list[dict[str, str]]) -> None:
        super().__init__(trainer)
        self.turns = turns

    def _compose_teacher_prompt(self, prompt: Any, privileged_context: Any) -> Any:
        return [*self.turns, *prompt]


async def run_sdft(task: Task, artifacts: Path, budget: float) -> dict[str, float]:
    """TRL's SDFTTrainer (its defaults: the base as teacher, top-100 logit distillation)
    for `budget` seconds, the example's system line and examples as its privileged
    context, `group_size` samples a prompt as opd draws them."""
    spec = task.measured
    context = spec.teacher.self
    assert context is not None
    questions = training_questions(task)

    def trainer(training: LocalTrainingClient, stop: Budget, _: None) -> SDFTTrainer:
        dataset = Dataset.from_dict(
            {
                "prompt": [[{"role": "user", "content": q}] for q in questions],
                "privileged_context": ["(the context's chat turns)"] * len(questions),
            }
        )
        config = SDFTConfig(
            output_dir=str(artifacts / "sdft"),
            num_generations=spec.loop.group_size,
            max_completion_length=spec.sampling.max_tokens,
            temperature=spec.sampling.temperature,
            teacher_model_kind="base",
            **peer_config(task),
        )
        sdft = SDFTTrainer(
            model=training.model,
            args=config,
            train_dataset=dataset,
            processing_class=training.tokenizer,
            callbacks=[stop],
        )
        empty = Conversation.model_construct(messages=[], tools=None)
        turns = [
            {"role": turn.role, "content": turn.text()}
            for turn in in_context(empty, context, None).messages
        ]
        sdft.teacher_context_builder = ContextTurns(sdft, turns)
        return sdft

    training, took = await a_peer(task, artifacts, budget, trainer)
    return await measure(task, training, int(took["steps"])) | took


async def untrained(task: Task, artifacts: Path) -> dict[str, float]:
    """The untrained student and the prompted teacher, with the facts the base gets right."""
    spec = task.measured
    training = await LocalServiceClient(spec.local, artifacts).create_lora_training_client_async(
        spec.student.base_model, spec.student.lora_rank, spec.student.seed
    )
    return await measure(task, training, 0, teacher=True)


PEERS = {"sft": run_sft, "sdft": run_sdft}


async def run_all(args: argparse.Namespace, figures: dict[str, Any]) -> None:
    await each_seed_apart(args, figures, run_seed)


SeedRun = Callable[[argparse.Namespace, int, Any], Awaitable[tuple[Any, dict[str, Any]]]]


async def each_seed_apart(
    args: argparse.Namespace, figures: dict[str, Any], run_seed: SeedRun
) -> None:
    """Every seed's `run_seed` (its arms), added to `figures` seed by seed (and written to
    --json after each, so a long run cut short keeps its finished seeds). Each seed runs in
    a process of its own: what its arms' models held goes back to the system when it ends
    (in one process three seeds grew past 18 GB and the OOM killer ended the run)."""
    spawn = multiprocessing.get_context("spawn")
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        with ProcessPoolExecutor(1, mp_context=spawn) as apart:
            figures["before"], row = await asyncio.get_running_loop().run_in_executor(
                apart, seed_apart, run_seed, args, seed, figures["before"]
            )
        figures["seeds"].append(row)
        if args.json:
            args.json.write_text(json.dumps(figures, indent=2))


def seed_apart(
    run_seed: SeedRun, args: argparse.Namespace, seed: int, before: Any
) -> tuple[Any, dict[str, Any]]:
    """A seed's run in the process it was sent to: the untrained figures (measured there
    when `before` is None) and its row. It ends when the run that sent it is killed
    (a pool's process would go on to the seed's end: minutes of both cores and GBs)."""
    warnings.filterwarnings("ignore", category=FutureWarning)
    threading.Thread(target=end_with_parent, args=(os.getppid(),), daemon=True).start()
    return asyncio.run(run_seed(args, seed, before))


def end_with_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(2)
    os._exit(1)


async def run_seed(
    args: argparse.Namespace, seed: int, before: dict[str, float] | None
) -> tuple[dict[str, float], dict[str, Any]]:
    """One seed: opd, then each peer for opd's steps' time, the untrained student first
    when no seed has measured it yet."""
    row: dict[str, Any] = {"seed": seed}
    with tempfile.TemporaryDirectory() as folder:
        artifacts = Path(folder)
        task = Task.load(example_data(args, seed), args, artifacts)
        if before is None:
            before = await untrained(task, artifacts)
            progress(seed, "untrained student and prompted teacher", before)
        row["opd"] = await run_opd(task, artifacts, vllm=args.vllm)
        progress(seed, "OPD", row["opd"])
        for peer in args.peers:
            gc.collect()  # the last arm's model (peft's modules hold cycles) goes first
            row[peer] = await PEERS[peer](task, artifacts, row["opd"]["step_seconds"])
            progress(seed, ARM_NAMES[peer], row[peer])
    return before, row


def progress(seed: int, what: str, figures: dict[str, Any]) -> None:
    shown = ", ".join(
        f"{k} {mean(v) if k == 'facts' else v:.3g}" for k, v in figures.items() if k != "answers"
    )
    print(f"  seed {seed}, {what}: {shown}", flush=True)


def kept_share(facts: Sequence[bool], base: Sequence[bool]) -> float:
    """The share of the facts the base answers right that these answers get right."""
    counted = [now for now, then in zip(facts, base, strict=True) if then]
    return statistics.mean(counted) if counted else math.nan


def gap_closed(after: float, before: float, teacher: float) -> float:
    return (after - before) / (teacher - before) if teacher != before else math.nan


def per_answer(figures: dict[str, float]) -> float:
    """The reverse KL summed over an answer's tokens, the mean over answers: the
    sequence-level divergence the sampled reverse KL estimates (the eval's per-token mean
    times the mean answer length, exactly). The per-token mean alone changes meaning when
    the answers shrink from 20 tokens of prose to a number."""
    return figures["reverse_kl"] * figures["tokens"]


def median_answer(figures: dict[str, Any]) -> float:
    """The median answer's reverse KL (summed over its tokens)."""
    return statistics.median(a["kl"] for a in figures["answers"])


def not_bare_share(figures: dict[str, Any]) -> float:
    """The share of the answers' summed reverse KL that the answers not a bare number
    carry (the per-answer mean is theirs when it is most of it)."""
    total = sum(a["kl"] for a in figures["answers"])
    return sum(a["kl"] for a in figures["answers"] if not a["bare"]) / total if total else math.nan


def mean(values: list[float]) -> float:
    return statistics.mean(values) if values else math.nan


LABEL_WIDTH = 44


def table_head(seeds: list[int]) -> str:
    """A table's head: a column a seed, then their mean."""
    columns = "".join(f"{'seed ' + str(s):>10}" for s in seeds)
    return f"{'':<{LABEL_WIDTH}}{columns}{'mean':>10}"


def table_line(label: str, values: list[float], style: str) -> str:
    cells = "".join(f"{format(v, style):>10}" for v in values)
    return f"{label:<{LABEL_WIDTH}}{cells}{mean(values):>10{style}}"


def report(figures: dict[str, Any]) -> tuple[list[str], bool]:
    """The tables and the targets' lines; whether every target was met."""
    before, rows = figures["before"], figures["seeds"]
    arms = [arm for arm in ARMS if all(arm in row for row in rows)]
    seeds = [r["seed"] for r in rows]
    head = table_head(seeds)

    def side(arm: str, key: str) -> list[float]:
        return [r[arm][key] for r in rows]

    def of(arm: str, measure_: Callable[[dict[str, Any]], float]) -> list[float]:
        return [measure_(r[arm]) for r in rows]

    def untrained_row(value: float) -> list[float]:
        return [value] * len(rows)

    def kept(figures_: dict[str, Any]) -> float:
        return kept_share(figures_["facts"], before["facts"])

    settings = figures["settings"]
    lines = [
        f"OPD: {settings['steps']} steps of {settings['objective']}; peers: TRL's "
        f"{', '.join(ARM_NAMES[a] for a in arms[1:])} for as long",
        "",
        f"held-out format compliance (a bare integer), {settings['holdout']} problems x "
        f"{settings.get('answers', 1)} answers",
        head,
        table_line("untrained student", untrained_row(before["compliance"]), ".1%"),
        table_line("prompted teacher", untrained_row(before["teacher_compliance"]), ".1%"),
    ]
    lines += [table_line(ARM_NAMES[a], side(a, "compliance"), ".1%") for a in arms]
    lines += ["", "held-out reverse KL to the prompted teacher, per answer (nats)", head]
    lines.append(table_line("untrained student", untrained_row(per_answer(before)), ".2f"))
    lines += [table_line(ARM_NAMES[a], of(a, per_answer), ".2f") for a in arms]
    if all("answers" in r[a] for r in rows for a in arms) and "answers" in before:
        lines.append("... the median answer's")
        lines.append(table_line("untrained student", untrained_row(median_answer(before)), ".2f"))
        lines += [table_line(ARM_NAMES[a], of(a, median_answer), ".2f") for a in arms]
        lines.append("... the share the answers that are not a bare number carry")
        lines.append(table_line("untrained student", untrained_row(not_bare_share(before)), ".1%"))
        lines += [table_line(ARM_NAMES[a], of(a, not_bare_share), ".1%") for a in arms]
    lines.append("... per token (eval/reverse_kl_mean)")
    lines.append(table_line("untrained student", untrained_row(before["reverse_kl"]), ".3f"))
    lines += [table_line(ARM_NAMES[a], side(a, "reverse_kl"), ".3f") for a in arms]
    lines.append("... the answers' length (tokens)")
    lines.append(table_line("untrained student", untrained_row(before["tokens"]), ".1f"))
    lines.append(table_line("prompted teacher", untrained_row(before["teacher_tokens"]), ".1f"))
    lines += [table_line(ARM_NAMES[a], side(a, "tokens"), ".1f") for a in arms]
    lines += ["", "held-out correctness (the answer is the reference)", head]
    lines.append(table_line("untrained student", untrained_row(before["correct"]), ".1%"))
    lines.append(table_line("prompted teacher", untrained_row(before["teacher_correct"]), ".1%"))
    lines += [table_line(ARM_NAMES[a], side(a, "correct"), ".1%") for a in arms]
    general = settings["general"]
    lines += [
        "",
        f"what it keeps: reverse KL to the untrained base, {general} general questions "
        "(nats/token)",
        head,
        table_line("untrained student", untrained_row(before["general_kl"]), ".3f"),
    ]
    lines += [table_line(ARM_NAMES[a], side(a, "general_kl"), ".3f") for a in arms]
    right = sum(before["facts"])
    lines += [
        "",
        f"what it keeps: of the {right} of {len(FACTS)} facts the base answers right "
        "(greedy), those still right",
        head,
    ]
    lines += [table_line(ARM_NAMES[a], of(a, kept), ".1%") for a in arms]
    lines += ["", "wall time (s)", head]
    lines.append(table_line("OPD run (load, preflight, steps)", side("opd", "wall_seconds"), ".0f"))
    lines.append(table_line("OPD steps: the budget", side("opd", "step_seconds"), ".0f"))
    for arm in arms[1:]:
        lines.append(
            table_line(f"{arm.upper()} (its samples and steps)", side(arm, "wall_seconds"), ".0f")
        )
        lines.append(
            table_line(f"{arm.upper()} steps taken", [float(s) for s in side(arm, "steps")], ".0f")
        )
    opd = {key: mean(side("opd", key)) for key in ("compliance", "general_kl")}
    opd_kl = mean(of("opd", per_answer))
    checks = [
        (
            f"OPD's compliance >= {TARGET_COMPLIANCE:.0%}",
            opd["compliance"] >= TARGET_COMPLIANCE,
            f"{opd['compliance']:.1%}",
        )
    ]
    if "sft" in arms:
        sft_drift = mean(side("sft", "general_kl"))
        checks.append(
            (
                f"OPD's drift on general questions <= {TARGET_DRIFT_OF_SFT:g} x SFT's",
                opd["general_kl"] <= TARGET_DRIFT_OF_SFT * sft_drift,
                f"{opd['general_kl']:.3f} vs {sft_drift:.3f}",
            )
        )
    if "sdft" in arms:
        sdft = {key: mean(side("sdft", key)) for key in ("compliance", "general_kl")}
        sdft_kl = mean(of("sdft", per_answer))
        checks += [
            (
                "OPD's drift on general questions <= SDFT's",
                opd["general_kl"] <= sdft["general_kl"],
                f"{opd['general_kl']:.3f} vs {sdft['general_kl']:.3f}",
            ),
            (
                "OPD >= SDFT on compliance",
                opd["compliance"] >= sdft["compliance"],
                f"{opd['compliance']:.1%} vs {sdft['compliance']:.1%}",
            ),
            (
                "OPD <= SDFT on the reverse KL to the prompted teacher, per answer",
                opd_kl <= sdft_kl,
                f"{opd_kl:.2f} vs {sdft_kl:.2f} nats",
            ),
        ]
    return targets(lines, checks)


def targets(lines: list[str], checks: list[tuple[str, bool, str]]) -> tuple[list[str], bool]:
    """The tables' lines with a line a target after them, and whether every one was met."""
    lines = [*lines, ""]
    lines += [
        f"target: {what}: {'met' if ok else 'NOT met'} ({shown})" for what, ok, shown in checks
    ]
    return lines, all(ok for _, ok, _ in checks)


def main() -> int:
    parser = benchmark_parser(__doc__, list(PEERS), "datasets.1.weight=0.5")
    parser.add_argument("--steps", type=int, default=10, help="opd's steps")
    parser.add_argument(
        "--objective",
        default=str(yaml.safe_load(EXAMPLE.read_text())["loop"]["objective"]),
        help="opd's loop.objective (YAML); default: the example's",
    )
    parser.add_argument(
        "--answers",
        type=int,
        default=4,
        help="answers sampled per held-out problem (at 1, one answer in 60 can carry a "
        "quarter of the per-answer reverse KL)",
    )
    parser.add_argument("--general", type=int, default=len(GENERAL_QUESTIONS))
    parser.add_argument("--vllm", help="opd's rollouts on this vLLM server (its /v1 URL)")
    args = parser.parse_args()
    return benchmark_run(
        args,
        f"real_model: {EXAMPLE.name}, {args.steps} steps of {args.objective}, seeds "
        f"{seed_range(args)}, peers {' '.join(args.peers)}, {args.holdout} held-out problems "
        f"x {args.answers} answers, {args.general} general questions, {len(FACTS)} facts",
        {
            "seeds": args.seeds,
            "steps": args.steps,
            "objective": args.objective,
            "set": args.set,
            "holdout": args.holdout,
            "answers": args.answers,
            "general": args.general,
            "engine": "vllm" if args.vllm else "local",
        },
        run_all,
        report,
    )


def benchmark_parser(doc: str | None, peers: list[str], example: str) -> argparse.ArgumentParser:
    """The options every benchmark of a real model takes."""
    parser = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3, help="how many seeds")
    parser.add_argument("--first-seed", type=int, default=1, help="student.seed of the first")
    parser.add_argument("--peers", nargs="*", default=peers, choices=peers)
    parser.add_argument("--holdout", type=int, default=60, help="held-out problems")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help=f"another example setting, dotted ({example}; YAML values)",
    )
    parser.add_argument("--json", type=Path, help="keep every figure in this file")
    parser.add_argument(
        "--untrained",
        type=Path,
        help="the untrained student's figures from a kept run's --json (the same for every "
        "seed and setting of the student's): not measured again",
    )
    parser.add_argument(
        "--tables",
        type=Path,
        nargs="+",
        help="print the tables of --json files (their seeds together), run nothing",
    )
    return parser


def seed_range(args: argparse.Namespace) -> str:
    return f"{args.first_seed}..{args.first_seed + args.seeds - 1}"


def kept_runs(paths: list[Path]) -> dict[str, Any]:
    """The figures of runs kept apart (`--first-seed` runs, each with --json) as one: the
    first one's settings and untrained figures, every run's seeds."""
    runs = [json.loads(path.read_text()) for path in paths]
    return runs[0] | {"seeds": [row for run in runs for row in run["seeds"]]}


def benchmark_run(
    args: argparse.Namespace,
    header: str,
    settings: dict[str, Any],
    run_all: Callable[[argparse.Namespace, dict[str, Any]], Awaitable[None]],
    report: Callable[[dict[str, Any]], tuple[list[str], bool]],
) -> int:
    """One benchmark's run (or, with --tables, a kept run's figures): its tables, and 0 when
    its targets were met, 1 when one was missed (the exit status)."""
    if args.tables:
        lines, met = report(kept_runs(args.tables))
        print("\n".join(lines))
        return 0 if met else 1
    warnings.filterwarnings("ignore", category=FutureWarning)
    load = os.getloadavg()[0]
    machine = f"{cpu_name()}, {os.cpu_count()} CPUs"
    print(f"{header}; {machine}, load average {load:.2f}", flush=True)
    started = time.perf_counter()
    figures: dict[str, Any] = {
        "settings": settings | {"machine": machine, "load_average": [load]},
        "before": json.loads(args.untrained.read_text())["before"] if args.untrained else None,
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
