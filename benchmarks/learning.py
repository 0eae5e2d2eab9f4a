"""How fast the student learns the arithmetic task: held-out accuracy against steps and
against wall time, for the losses, max_steps_off_policy and the main settings.

    python benchmarks/learning.py [--studies losses off_policy lr rank group kl teachers
                                            reward objective]
                                  [--seeds 3] [--steps 100] [--every 25] [--holdout 100]
                                  [--json out.json]
    python benchmarks/learning.py --tables out.json     # the tables again, from the curves

Every run is the demo's job (examples/arith.yaml: arith-student learning from
arith-teacher) with one setting changed, run by the real loop with the eval's grader.
`losses` (at max_steps_off_policy 2, where the losses differ), `lr`, `rank`, `group`, `kl`,
`reward` and `objective` (loop.objective: the reference and the logit-level objectives)
run on the local backend; `off_policy` runs
k = 0, 1, 2 against the PyTRIO fake made to answer like a remote engine with the
latencies of loop_speed.py (its `Engine`), the fake serving the arithmetic models
themselves. Each setting runs once per seed (student.seed: the LoRA's init and the
sampling), and the tables give the mean and spread (standard deviation) over seeds.
Wall time is the time the steps took, evals left out. See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from loop_speed import Engine, Latencies, RemoteTrainer
from pytrio.types import ModelInput, SampleResponse, SamplingParams

from kernel.spec import JobSpec
from tests.fakes.trio import validated_request
from worker.engine.backends import connect
from worker.engine.backends.local import LocalServiceClient
from worker.engine.backends.resilient import resilient
from worker.engine.backends.trio import ERRORS
from worker.engine.data.datasets import load_datasets
from worker.engine.eval.evaluation import Grade
from worker.engine.eval.grading import Grader
from worker.engine.eval.prompts import load_eval_prompts
from worker.engine.loop.steps import run_loop
from worker.engine.tracking.sinks import Sink

DEMO_SPEC = Path(__file__).resolve().parents[1] / "examples" / "arith.yaml"
LOOP_SPEED_LATENCIES = Latencies(
    refresh=0.1, sample=0.2, teacher=0.05, forward_backward=0.15, optim=0.02
)
STUDIES: dict[str, tuple[str, list[Any]]] = {
    "losses": ("loop.loss_fn", ["importance_sampling", "ppo", "cispo", "dro"]),
    "off_policy": ("loop.max_steps_off_policy", [0, 1, 2]),
    "lr": ("optim.learning_rate", [1e-3, 3e-3, 1e-2]),
    "rank": ("student.lora_rank", [8, 32, 64]),
    "group": ("loop.group_size", [2, 4, 8]),
    "kl": ("loop.kl_discount_factor", [0.0, 0.5, 0.9]),
    "teachers": ("teacher_mixture", ["route", "mixture"]),
    "reward": ("loop.reward.coef", [0.0, 0.5, 2.0]),
    "objective": (
        "loop.objective",
        [
            "sampled_reverse_kl",
            "reverse_kl",
            "forward_kl",
            "jsd",
            {"kind": "reverse_kl", "top_k": 16},
            {"kind": "forward_kl", "top_k": 16},
        ],
    ),
}
REFERENCE_SHAPE = {
    "loop.objective": "sampled_reverse_kl",
    "loop.batch_size": 8,
    "loop.group_size": 4,
}
"""What every study keeps of the reference (the demo now trains jsd on 32 x 1): the studies
vary the reference's loop, and their published figures were measured so."""
STUDY_FIXED: dict[str, dict[str, Any]] = {"losses": {"loop.max_steps_off_policy": 2}}
"""Settings a study holds fixed apart from the demo's: on-policy (k = 0) every loss takes
the same gradient (each ratio is 1, nothing clips), so the losses are compared where their
corrections for stale rollouts differ."""
MOPD_SPEC = DEMO_SPEC.with_name("mopd-arith.yaml")
STUDY_SPECS = {"teachers": MOPD_SPEC}
"""Studies of another job than the demo's: `teachers` runs examples/mopd-arith.yaml (add
from the addition teacher, mul from the multiplication teacher), its accuracy over both
domains' held-out problems."""


class ServedSampler:
    """A real model's sampler behind a remote sampler's latency; its requests are checked
    by PyTRIO's own request builder first, as the PyTRIO fake checks them."""

    def __init__(self, sampler: Any, engine: Engine) -> None:
        self.sampler, self.engine = sampler, engine

    def get_tokenizer(self) -> Any:
        return self.sampler.get_tokenizer()

    async def sample_async(
        self,
        prompt: ModelInput,
        num_samples: int = 1,
        sampling_params: SamplingParams = SamplingParams(),  # noqa: B008 - immutable default
        include_prompt_logprobs: bool = False,
        topk_prompt_logprobs: int = 0,
        return_text: bool = True,
    ) -> SampleResponse:
        validated_request(
            prompt,
            num_samples,
            sampling_params,
            include_prompt_logprobs,
            topk_prompt_logprobs,
            return_text,
        )
        work = self.sampler.sample_async(
            prompt, num_samples, sampling_params, include_prompt_logprobs, 0, return_text
        )
        return await self.engine.answer(self.engine.latencies.sample, work)

    async def compute_logprobs_async(self, prompt: ModelInput) -> list[float | None]:
        work = self.sampler.compute_logprobs_async(prompt)
        return await self.engine.answer(self.engine.latencies.teacher, work)


class ServedTrainer(RemoteTrainer):
    """A real LoRA trainer behind the remote trainer's queue of loop_speed.py."""

    sampler_type = ServedSampler


class ServedService:
    """The PyTRIO fake's service, serving the arithmetic models from the local backend."""

    def __init__(self, local: LocalServiceClient, engine: Engine) -> None:
        self.local, self.engine = local, engine

    async def create_lora_training_client_async(
        self, base_model: str, rank: int = 32, seed: int | None = None
    ) -> ServedTrainer:
        training = await self.local.create_lora_training_client_async(base_model, rank, seed)
        return ServedTrainer(training, self.engine)

    async def create_sampling_client_async(
        self, base_model: str, model_path: str | None = None
    ) -> ServedSampler:
        sampler = await self.local.create_sampling_client_async(base_model, model_path)
        return ServedSampler(sampler, self.engine)


@dataclass
class Curve(Sink):
    """Each eval's accuracy, at the step it ran and the wall time the steps had taken."""

    steps: list[int] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    accuracy: list[float] = field(default_factory=list)
    teacher: float | None = None
    trained_seconds: float = 0.0

    def step(self, step: int, metrics: dict[str, float]) -> None:
        self.record(step, metrics)
        self.trained_seconds += metrics["time/step_elapsed_time"]

    def eval(self, step: int, metrics: dict[str, float]) -> None:
        self.record(step, metrics)

    def record(self, step: int, metrics: dict[str, float]) -> None:
        if "eval/accuracy" in metrics:
            self.steps.append(step)
            self.seconds.append(self.trained_seconds)
            self.accuracy.append(metrics["eval/accuracy"])
        self.teacher = metrics.get("eval/teacher_accuracy", self.teacher)


def job_spec(base: dict[str, Any], setting: str, value: Any, seed: int) -> JobSpec:
    data = json.loads(json.dumps(base))
    data["student"]["seed"] = seed
    set_setting(data, setting, value)
    if data.get("teacher_mixture") == "mixture":
        # Every teacher scores every prompt: no dataset names one, and no mixture answers.
        for dataset in data["datasets"]:
            dataset.pop("teacher", None)
        data["eval"]["teacher_baseline"] = False
    return JobSpec.model_validate(data)


def set_setting(data: dict[str, Any], setting: str, value: Any) -> None:
    """Set a dotted setting (`loop.loss_fn`, `datasets.1.weight`) of a spec's data."""
    *groups, key = setting.split(".")
    target: Any = data
    for group in groups:
        target = target[int(group)] if isinstance(target, list) else target.setdefault(group, {})
    if isinstance(target, list):
        target[int(key)] = value
    else:
        target[key] = value


def study_base(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """A study's job with the run's steps and evals; the holdout is the demo's only (a
    spec of several datasets keeps its own, taken from each)."""
    base = yaml.safe_load(STUDY_SPECS.get(name, DEMO_SPEC).read_text())
    for setting, value in (REFERENCE_SHAPE | STUDY_FIXED.get(name, {})).items():
        set_setting(base, setting, value)
    base["loop"]["steps"] = args.steps
    base["eval"]["every"] = args.every
    if "datasets" not in base:
        base["eval"]["holdout"] = args.holdout
    return base


async def run(spec: JobSpec, remote: Latencies | None, artifacts: Path, grade: Grade) -> Curve:
    prompts = load_datasets(spec, artifacts, False)
    eval_prompts = load_eval_prompts(spec, artifacts, False)
    if remote is None:
        service = connect(spec, artifacts, lambda *_: None)  # as the worker connects
    else:
        served = ServedService(LocalServiceClient(spec.local, artifacts), Engine(remote))
        service = resilient(served, ERRORS, lambda *_: None)  # type: ignore[arg-type]
    curve = Curve()
    await run_loop(spec, service, prompts, curve, eval_prompts=eval_prompts, grade=grade)
    return curve


@dataclass(frozen=True)
class Row:
    """One setting over its seeds."""

    value: Any
    curves: list[Curve]

    def at_step(self, index: int) -> tuple[float, float]:
        values = [c.accuracy[index] for c in self.curves]
        return statistics.mean(values), spread(values)

    def at_time(self, seconds: float) -> tuple[float, float]:
        """Each run's accuracy at the last eval it had reached by `seconds` of steps."""
        values = [
            next(a for t, a in zip(c.seconds[::-1], c.accuracy[::-1], strict=True) if t <= seconds)
            for c in self.curves
        ]
        return statistics.mean(values), spread(values)

    def time_to_reach(self, target: float) -> float | None:
        """The mean wall time of the first eval whose mean accuracy over seeds is at or above
        `target`; None if none is."""
        for index in range(len(self.curves[0].accuracy)):
            if self.at_step(index)[0] >= target - 1e-9:
                return statistics.mean(c.seconds[index] for c in self.curves)
        return None

    def trained_seconds(self) -> float:
        """The mean wall time of all the steps."""
        return statistics.mean(c.trained_seconds for c in self.curves)


def spread(values: list[float]) -> float:
    return statistics.stdev(values) if len(values) > 1 else 0.0


def label(value: Any) -> str:
    """A setting's value as the tables and --values name it: a mapping as its `kind` and
    its other fields (`forward_kl top_k=16`)."""
    if isinstance(value, dict):
        return " ".join(str(v) if k == "kind" else f"{k}={v}" for k, v in value.items())
    return str(value)


def cell(mean: float, deviation: float) -> str:
    return f"{mean:.0%} ± {deviation:.0%}"


def print_study(name: str, setting: str, rows: list[Row]) -> dict[str, Any]:
    steps = rows[0].curves[0].steps
    teachers = [c.teacher for r in rows for c in r.curves if c.teacher is not None]
    teacher = f", teacher {statistics.mean(teachers):.0%}" if teachers else ""
    print(f"\n{name}: {setting}, held-out accuracy (mean ± sd over seeds){teacher}")
    print(f"{'vs steps':<22}" + "".join(f"{'step ' + str(s):>14}" for s in steps))
    for row in rows:
        cells = [cell(*row.at_step(i)) for i in range(len(steps))]
        print(f"{label(row.value):<22}" + "".join(f"{c:>14}" for c in cells))
    longest = max(c.seconds[-1] for r in rows for c in r.curves)
    times = [longest * i / 4 for i in range(1, 5)]
    print(f"{'vs wall time':<22}" + "".join(f"{f'{t:.0f} s':>14}" for t in times))
    for row in rows:
        cells = [cell(*row.at_time(t)) for t in times]
        print(f"{label(row.value):<22}" + "".join(f"{c:>14}" for c in cells))
    took = ", ".join(f"{label(r.value)}: {r.trained_seconds():.0f} s" for r in rows)
    print(f"the steps took: {took}")
    figures: dict[str, Any] = {
        "setting": setting,
        "rows": [{"value": r.value, "runs": [asdict(c) for c in r.curves]} for r in rows],
    }
    if name == "off_policy":
        target = rows[0].at_step(len(steps) - 1)[0]
        print(f"time to reach the on-policy run's final accuracy ({target:.0%}):")
        reach = {}
        for row in rows:
            seconds = row.time_to_reach(target)
            reach[str(row.value)] = seconds
            shown = "not reached" if seconds is None else f"{seconds:.0f} s"
            print(f"  k = {row.value}: {shown}")
        figures["time_to_on_policy_final"] = reach
    return figures


async def run_studies(args: argparse.Namespace, latencies: Latencies) -> dict[str, Any]:
    """Every study's rows; one grader serves every run (a pool's start costs seconds)."""
    figures = {}
    async with Grader() as grader:
        for name in args.studies:
            setting, values = STUDIES[name]
            base = study_base(name, args)
            if args.values:
                values = [v for v in values if label(v) in args.values] or values
            remote = latencies if name == "off_policy" else None
            rows = []
            for value in values:
                curves = []
                for seed in range(args.seeds):
                    spec = job_spec(base, setting, value, seed)
                    with tempfile.TemporaryDirectory() as artifacts:
                        curve = await run(spec, remote, Path(artifacts), grader.grade_answers)
                    curves.append(curve)
                    print(
                        f"  {name} {label(value)} seed {seed}: "
                        + " ".join(f"{a:.0%}" for a in curve.accuracy)
                        + f" ({curve.trained_seconds:.0f} s of steps)",
                        flush=True,
                    )
                rows.append(Row(value, curves))
            figures[name] = print_study(name, setting, rows)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--studies", nargs="+", choices=list(STUDIES), default=list(STUDIES))
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--every", type=int, default=25)
    parser.add_argument("--holdout", type=int, default=100)
    parser.add_argument("--values", nargs="+", help="only these values of each study's setting")
    parser.add_argument("--latency-scale", type=float, default=1.0)
    parser.add_argument("--json", type=Path, help="keep every curve in this file")
    parser.add_argument(
        "--tables", type=Path, help="print the tables of a --json file, run nothing"
    )
    args = parser.parse_args()
    if args.tables:
        for name, study in json.loads(args.tables.read_text()).items():
            rows = [Row(r["value"], [Curve(**c) for c in r["runs"]]) for r in study["rows"]]
            print_study(name, study["setting"], rows)
        return
    latencies = Latencies(
        *(args.latency_scale * getattr(LOOP_SPEED_LATENCIES, f) for f in Latencies.__annotations__)
    )
    print(
        f"learning: {args.steps} steps, eval every {args.every} (the demo's on "
        f"{args.holdout} held-out problems), {args.seeds} seeds; load average "
        f"{os.getloadavg()[0]:.2f}"
    )
    started = time.perf_counter()
    figures = asyncio.run(run_studies(args, latencies))
    print(f"\n{time.perf_counter() - started:.0f} s in all; load average {os.getloadavg()[0]:.2f}")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
