"""The OPD training loop (docs/algorithm.md), one readable loop over the backend contract.

Per step: refresh the sampler, sample `group_size` completions for each of the step's
prompts concurrently, let the teacher score every completion, build the datums, then
`forward_backward` and `optim_step`. With `loop.max_steps_off_policy` = k >= 1 the
rollouts of the next k steps are sampled while this one trains (`pipeline.py`), from
weights a fixed schedule names (`schedule.py`). The prompt order is a function of the step
and the backend's training state carries its RNG, so a run resumed from the state saved
after n steps (and the sampler weights the schedule still needs) reproduces steps n..N of
an uninterrupted run. Held-out evals (`eval/`) run at their boundaries from a sampler of
their own, so they never change the training.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AsyncExitStack, contextmanager
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

import numpy as np
from pytrio.types import AdamParams, Datum, ForwardBackwardOutput, SamplingParams

from kernel.errors import OPDError
from kernel.samples import MAX_PROMPT_CHARS, MAX_SAMPLE_TOKENS, KeptSample, keeps_samples
from kernel.spec import (
    InitFrom,
    JobSpec,
    LoopSpec,
    PromptOptions,
    SavedWeights,
    TeacherSpec,
    named,
)
from kernel.storage.cache import BlobCache
from kernel.storage.checkpoints import CheckpointStore
from worker.engine.backends.contract import SamplingClient, ServiceClient, TrainingClient
from worker.engine.cross_tokenizer import Tokenizers, top_k_of
from worker.engine.datasets import Prompts
from worker.engine.eval.evaluation import Evaluation, Grade, due, with_baseline
from worker.engine.eval.prompts import EVAL_DATASET
from worker.engine.mix import Item, Mix, Pool, TeacherMixture, pools_of, training_pools
from worker.engine.pipeline import Rollouts, sampler_weights_name
from worker.engine.preflight import PROMPTS_CHECKED, check_objective, teacher_mode
from worker.engine.reward import group_rewards, require_answers, reward_bonus, reward_metrics
from worker.engine.rollouts import (
    Batch,
    Completion,
    Scorer,
    logit_datums,
    opd_datums,
    sample_and_score,
    with_teacher_logprobs,
)
from worker.engine.schedule import resume_versions
from worker.engine.sinks import RunInfo, Sink
from worker.engine.teachers import Answerer, Renderer, TeacherView, server_view


class Stop(Enum):
    """A stop asked for at the next step boundary. `resume` (a pause, a worker shutting
    down) saves a state to resume from, and with k >= 1 trains on until a resumed run can
    sample the same rollouts; `cancel` ends the run at the very next boundary, the last
    one included, with its state (another job may continue from it) and no sampler
    weights: the run never resumes."""

    resume = "resume"
    cancel = "cancel"


@dataclass(frozen=True)
class SavedState:
    """A training state a run can resume from, and the steps it had taken."""

    path: str
    step: int
    samplers: Mapping[int, str] = field(default_factory=dict)
    """With max_steps_off_policy >= 1: saved sampler weights by the steps they had taken,
    those the steps after `step` sample from (more may be given)."""


@dataclass(frozen=True)
class RunResult:
    steps_done: int
    stopped: bool = False
    final_weights_path: str | None = None
    state: SavedState | None = None


def state_name(spec: JobSpec, steps_done: int) -> str:
    return f"{spec.weights_name}-state-{steps_done:06d}"


def stop_sequences(tokenizer: Any) -> list[str]:
    return list(dict.fromkeys(x for x in (tokenizer.eos_token, "<|im_end|>") if x))


OBJECTIVE_METRICS = {
    "objective_mean": "opd/objective_mean",
    "teacher_mass_mean": "opd/teacher_mass_mean",
}
"""What a logit-level objective's backend reports, by the names people chart: the
objective's value per completion position and, with top_k, the teacher mass kept."""


def step_metrics(
    batch: Batch,
    items: list[Item],
    trainer_metrics: dict[str, float],
    lr: float,
    step: int,
    elapsed: float,
    phases: dict[str, float],
) -> dict[str, float]:
    """The reference's metric names (docs/algorithm.md#metrics), `trainer/<name>` from the
    backend, how many optimizer steps old the rollouts were, and where the step's time went
    (`time/<phase>`)."""
    counts = [len(c.tokens) for c in batch.completions]
    kls = np.concatenate([c.reverse_kl for c in batch.completions])
    staleness = [step - c.version for c in batch.completions]
    total = int(sum(counts))
    metrics: dict[str, float] = {
        "data/datums": len(batch.completions),
        "data/completion_tokens_mean": float(np.mean(counts)),
        "data/completion_tokens_total": total,
        "data/completion_tokens_per_second": total / elapsed,
        "opd/reverse_kl_mean": float(np.mean(kls)),
        "opd/reverse_kl_std": float(np.std(kls)),
        "train/learning_rate": lr,
        "train/step": step,
        "train/staleness_mean": float(np.mean(staleness)),
        "train/staleness_max": max(staleness),
        "time/step_elapsed_time": elapsed,
        "usage/sampled_tokens": batch.sampled_tokens,
        "usage/trained_tokens": batch.datum_tokens,
    }
    metrics.update(teacher_usage(batch, items))
    metrics.update(alignment_metrics(batch))
    metrics.update(dataset_metrics(batch, items))
    metrics.update({f"time/{name}": seconds for name, seconds in phases.items()})
    for name, value in trainer_metrics.items():
        metrics[OBJECTIVE_METRICS.get(name, f"trainer/{name}")] = float(value)
    return metrics


def teacher_usage(batch: Batch, items: list[Item]) -> dict[str, float]:
    """Tokens each teacher scored, its own prompt and the completion (`usage/teacher_tokens`:
    all of them; with several teachers also `usage/teacher_tokens/<teacher>`)."""
    teachers = {name for item in items for name in item.teachers}
    per_teacher = dict.fromkeys(sorted(teachers), 0)
    for completion in batch.completions:
        for name, tokens in completion.teacher_tokens.items():
            per_teacher[name] += tokens
    metrics: dict[str, float] = {"usage/teacher_tokens": sum(per_teacher.values())}
    if len(per_teacher) > 1:
        metrics |= {f"usage/teacher_tokens/{name}": n for name, n in per_teacher.items()}
    return metrics


ALIGNED = "opd/aligned_bytes_fraction"


def alignment_metrics(batch: Batch) -> dict[str, float]:
    """With a teacher of another tokenizer: the fraction of the step's completion bytes
    its tokens aligned with the student's (`opd/aligned_bytes_fraction`; with several such
    teachers, of all of theirs, and `.../<teacher>` for each)."""
    per_teacher: dict[str, list[tuple[int, int]]] = {}
    for completion in batch.completions:
        for name, aligned in completion.aligned_bytes.items():
            per_teacher.setdefault(name, []).append(aligned)
    if not per_teacher:
        return {}
    metrics = {ALIGNED: aligned_fraction([a for pairs in per_teacher.values() for a in pairs])}
    if len(per_teacher) > 1:
        metrics |= {f"{ALIGNED}/{name}": aligned_fraction(p) for name, p in per_teacher.items()}
    return metrics


def dataset_metrics(batch: Batch, items: list[Item]) -> dict[str, float]:
    """`data/datums/<dataset>` and `opd/reverse_kl_mean/<dataset>`, with several datasets."""
    pools = {item.pool.name for item in items}
    if len(pools) < 2:
        return {}
    metrics: dict[str, float] = {}
    for name in sorted(pools):
        mine = [c for c in batch.completions if items[c.group].pool.name == name]
        metrics[f"data/datums/{name}"] = len(mine)
        if mine:
            kls = np.concatenate([c.reverse_kl for c in mine])
            metrics[f"opd/reverse_kl_mean/{name}"] = float(np.mean(kls))
    return metrics


@dataclass
class Run:
    """One run's clients and settings, made once before its first step."""

    spec: JobSpec
    training: TrainingClient
    teachers: dict[str, TeacherView]
    tokenizer: Any
    params: SamplingParams
    adam: AdamParams
    sink: Sink
    renderer: Renderer
    """The student's chat template."""
    mixture: TeacherMixture | None = None
    """teacher_mixture: mixture: every teacher's weighted mixture."""

    def render(self, question: str, options: PromptOptions) -> list[int]:
        """A question as the student's prompt tokens, rendered as its dataset says."""
        return self.renderer(question, options)

    def scorer(self, item: Item, prompt: list[int]) -> Scorer:
        """What scores the completions of an item (`prompt`: the student's): its pool's
        teacher (route) or the mixture, each teacher after its own rendering."""
        pool = item.pool
        if pool.teacher is not None:
            return self.teachers[pool.teacher].prompted(item.question, pool.options, prompt)
        assert self.mixture is not None
        return self.mixture.of(
            [view.prompted(item.question, pool.options, prompt) for view in self.teachers.values()]
        )

    def answerer(self, item: Item, prompt: list[int]) -> Answerer:
        """The teacher that answers an item for the eval's baseline, from its own rendering."""
        pool = item.pool
        view = self.teachers[pool.teacher or next(iter(self.teachers))]
        return view.answerer(item.question, pool.options, prompt)

    def teacher_shares(self, pool: Pool) -> list[tuple[SamplingClient, float]]:
        """A pool's teachers with their weights in its distribution: its own (route), or
        every teacher's normalised share of the mixture."""
        if pool.teacher is not None:
            return [(self.teachers[pool.teacher].client, 1.0)]
        weights = self.spec.teacher_weights()
        total = sum(weights.values())
        return [(view.client, weights[name] / total) for name, view in self.teachers.items()]

    async def train(
        self, datums: list[Datum], teachers: list[list[tuple[SamplingClient, float]]]
    ) -> ForwardBackwardOutput:
        """One forward_backward (with a logit-level objective, against each datum's
        `teachers`) and one optim_step, both submitted before either is awaited."""
        loop = self.spec.loop
        if loop.objective.logit_level:
            fwd_bwd = await self.training.forward_backward_logits_async(
                datums,
                teachers,
                loop.objective,
                coef=loop.kl_penalty_coef,
                loss_fn=loop.loss_fn,
                loss_fn_config=loop.loss_options(),
            )
        else:
            fwd_bwd = await self.training.forward_backward_async(
                datums, loss_fn=loop.loss_fn, loss_fn_config=loop.loss_options()
            )
        optim = await self.training.optim_step_async(self.adam)
        result = await fwd_bwd
        await optim
        return result

    async def save_state(self, steps_done: int) -> SavedState:
        saved = await (await self.training.save_state_async(state_name(self.spec, steps_done)))
        self.sink.checkpoint(steps_done, "state", saved.path)
        return SavedState(saved.path, steps_done)

    async def save_checkpoint(self, steps_done: int) -> tuple[SavedState, str]:
        """A resumable state and sampler weights (and their path), as scheduled by
        `loop.save_every`."""
        state = await self.save_state(steps_done)
        name = sampler_weights_name(self.spec, steps_done)
        saved = await (await self.training.save_weights_for_sampler_async(name))
        self.sink.checkpoint(steps_done, "sampler", saved.path)
        return state, saved.path

    def kept(self, completions: list[Completion], items: list[Item]) -> list[KeptSample]:
        """Completions as people read them: the question, the text, each token's KL."""
        decode = self.tokenizer.decode
        kept: list[KeptSample] = []
        for completion in completions:
            tokens = completion.tokens[:MAX_SAMPLE_TOKENS]
            pieces = {token: decode([token]) for token in set(tokens)}
            kept.append(
                KeptSample(
                    prompt=items[completion.group].question[:MAX_PROMPT_CHARS],
                    completion=decode(tokens, skip_special_tokens=True),
                    tokens=[pieces[token] for token in tokens],
                    reverse_kl=completion.reverse_kl[: len(tokens)].tolist(),
                    truncated=len(tokens) < len(completion.tokens),
                )
            )
        return kept

    def decode(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=True)

    async def evaluate(self, evaluation: Evaluation, step: int) -> dict[str, float]:
        """The student's eval at this boundary; at step 0 the teacher's baseline too."""
        metrics = await evaluation.student(self.training)
        if step == 0 and evaluation.spec.teacher_baseline:
            metrics = with_baseline(metrics, await evaluation.teacher_baseline())
        return metrics


async def open_run(
    spec: JobSpec,
    service: ServiceClient,
    sink: Sink,
    resume: SavedState | None,
    pools: list[Pool] | None = None,
) -> Run:
    """Create the clients, restore a saved state, and check that every teacher can score
    the student's tokens (`preflight`), on the first prompts of each of `pools`."""
    training = await service.create_lora_training_client_async(
        base_model=spec.student.base_model, rank=spec.student.lora_rank, seed=spec.student.seed
    )
    if resume is not None:
        # PyTRIO accepts load_state only before the first training operation.
        await (await training.load_state_with_optimizer_async(resume.path))
        sink.event(
            "info",
            f"Resumed from {resume.path} at step {resume.step}",
            {"step": resume.step, "path": resume.path},
        )
    elif spec.student.init_from is not None:
        await start_from(training, spec.student.init_from, sink)
    tokenizer = await asyncio.to_thread(training.get_tokenizer)  # may download
    checked = [
        (question, pool.options)
        for pool in pools or []
        for question in pool.prompts.questions[:PROMPTS_CHECKED]
    ]
    teachers: dict[str, TeacherView] = {}
    stop = stop_sequences(tokenizer)
    try:
        for name, teacher_spec in spec.teacher_specs().items():
            who = teacher_named(spec, name, teacher_spec)
            if teacher_spec.server is not None:
                warn = warning_to(sink)
                view = await server_view(spec, name, service, tokenizer, checked, warn, stop)
            else:
                view = await loaded_view(spec, name, service, tokenizer, checked, who)
            teachers[name] = view
            if view.mode != "cross":  # a cross-tokenizer teacher's event gives the probe's
                mode_event(sink, who, view)  # alignment
    except BaseException:
        await close_teachers(teachers)
        raise
    params = SamplingParams(
        max_tokens=spec.sampling.max_tokens,
        seed=spec.student.seed,
        temperature=spec.sampling.temperature,
        top_p=spec.sampling.top_p,
        top_k=spec.sampling.top_k,
        stop=stop_sequences(tokenizer),
    )
    mixture = None
    if spec.teacher_mixture == "mixture":
        weights = spec.teacher_weights()
        mixture = TeacherMixture([weights[name] for name in teachers])
    adam = AdamParams(**spec.optim.model_dump())
    return Run(
        spec, training, teachers, tokenizer, params, adam, sink, Renderer(tokenizer), mixture
    )


async def loaded_view(
    spec: JobSpec,
    name: str,
    service: ServiceClient,
    tokenizer: Any,
    checked: list[tuple[str, PromptOptions]],
    who: str,
) -> TeacherView:
    """Teacher `name` as the backend loads it, in the mode the preflight finds it in."""
    teacher_spec = spec.teacher_specs()[name]
    if teacher_spec.init_from is not None:
        service_filled(teacher_spec.init_from, f"{spec.teacher_field(name)}.init_from")
    teacher = await service.create_sampling_client_async(
        base_model=teacher_spec.base_model, model_path=teacher_spec.weights()
    )
    teacher_tokenizer = await asyncio.to_thread(teacher.get_tokenizer)
    mode = teacher_mode(tokenizer, teacher_tokenizer, checked)
    check_objective(spec, who, mode)
    return TeacherView(
        name,
        teacher,
        None if mode == "same" else Renderer(teacher_tokenizer),
        Tokenizers.of(tokenizer, teacher_tokenizer, stop_sequences(tokenizer), top_k_of(teacher))
        if mode == "cross"
        else None,
    )


def warning_to(sink: Sink) -> Callable[[str, dict[str, Any]], None]:
    """A warning event of the run, for what retries a call."""
    return lambda message, data: sink.event("warning", message, data)


async def close_teachers(teachers: Mapping[str, TeacherView]) -> None:
    for view in teachers.values():
        await view.aclose()


def teacher_named(spec: JobSpec, name: str, teacher: TeacherSpec) -> str:
    """How messages name a teacher: its model, and its name when there are several."""
    if spec.teachers is None:
        return f"teacher {teacher.base_model!r}"
    return f"teacher {name!r} ({teacher.base_model!r})"


def mode_event(sink: Sink, who: str, view: TeacherView, aligned: float | None = None) -> None:
    """The preflight's event naming a teacher's mode and, with another tokenizer, the
    fraction of the probe batch's completion bytes its tokens aligned."""
    data: dict[str, Any] = {
        "teacher": view.name,
        "mode": view.mode,
        "chat_template": "same" if view.mode == "same" else "own",
    } | ({} if view.server is None else {"server": view.server})
    message = f"{who[0].upper()}{who[1:]}: {view.template}"
    if view.mode == "cross" and aligned is not None:
        data["aligned_bytes_fraction"] = aligned
        message += f"; {aligned:.1%} of the probe batch's completion bytes aligned"
    sink.event("info", message, data)


async def probe(run: Run, pools: list[Pool], start: int) -> None:
    """Before step 0, with several teachers or one with another tokenizer: one completion
    of each dataset's first prompt, from a sampler of its own, scored by every teacher
    (each after its own rendering of the prompt). Events: each cross-tokenizer teacher's
    mode with the fraction of those completions' bytes it aligned (without the probe when
    resuming) and, with several teachers, each one's reverse KL."""
    spec = run.spec
    cross = [name for name, view in run.teachers.items() if view.mode == "cross"]
    if start > 0 or (len(run.teachers) < 2 and not cross):
        for name in cross:
            mode_event(
                run.sink, teacher_named(spec, name, spec.teacher_specs()[name]), run.teachers[name]
            )
        return
    sampler = await run.training.save_weights_and_get_sampling_client_async()
    firsts = [(pool.prompts.questions[0], pool.options) for pool in pools]
    prompts = [run.render(question, options) for question, options in firsts]
    first = next(iter(run.teachers.values()))
    scorers = [first.prompted(*asked, p) for asked, p in zip(firsts, prompts, strict=True)]
    completions = (await sample_and_score(sampler, scorers, prompts, 1, run.params)).completions
    kls: dict[str, float | None] = {}
    for name, view in run.teachers.items():
        scored = await asyncio.gather(
            *(
                view.prompted(*firsts[c.group], c.prompt).score(c.tokens, c.student_logprobs)
                for c in completions
            )
        )
        kl = [
            np.subtract(c.student_logprobs, s.logprobs)
            for c, s in zip(completions, scored, strict=True)
        ]
        kls[name] = float(np.mean(np.concatenate(kl))) if kl else None
        if view.mode == "cross":
            aligned = [s.aligned_bytes[name] for s in scored]
            fraction = aligned_fraction(aligned)
            mode_event(
                run.sink, teacher_named(spec, name, spec.teacher_specs()[name]), view, fraction
            )
    if len(run.teachers) > 1:
        figures = ", ".join(
            f"{name} {'-' if kl is None else f'{kl:.4f}'}" for name, kl in kls.items()
        )
        run.sink.event("info", f"Probe reverse KL per teacher: {figures}", {"reverse_kl": kls})


def aligned_fraction(aligned: Sequence[tuple[int, int]]) -> float:
    """Bytes aligned over all bytes, of (aligned, total) pairs; 1 where there were none."""
    total = sum(t for _, t in aligned)
    return sum(a for a, _ in aligned) / total if total else 1.0


async def start_from(training: TrainingClient, init: InitFrom, sink: Sink) -> None:
    """Load the saved state a continued job starts from (weights, and the optimizer if
    asked); the job still counts its own steps from 0."""
    path = service_filled(init, "student.init_from")
    load = (
        training.load_state_with_optimizer_async
        if init.with_optimizer
        else training.load_state_async
    )
    await (await load(path))
    what = "weights and optimizer" if init.with_optimizer else "weights"
    sink.event("info", f"Started from the {what} of {path}", {"path": path})


def service_filled(ref: SavedWeights, field: str) -> str:
    """The path of saved weights a spec names: filled by the service, or given to `opd run`."""
    if ref.path is None:
        raise OPDError(
            f"{field} names job {ref.job} but no path: a job's weights are found by the "
            f"service (submit the spec to it), or give {field}.path",
            code="bad_init_from",
        )
    return ref.path


def eval_pools(spec: JobSpec, prompts: Prompts | Mapping[str, Prompts]) -> list[Pool]:
    """The eval's prompts by dataset: each dataset's held-out prompts, or eval.dataset's."""
    assert spec.eval is not None
    if spec.eval.dataset is None:
        return pools_of(spec, spec.dataset_shares(), prompts)
    return pools_of(spec, [named(spec.eval.dataset, EVAL_DATASET)], prompts)


def evaluation_for(run: Run, pools: list[Pool], grade: Grade | None) -> Evaluation:
    spec = run.spec.eval
    assert spec is not None
    items = [
        Item(q, a, pool)
        for pool in pools
        for q, a in zip(pool.prompts.questions, pool.prompts.answers, strict=True)
    ]
    prompts = [run.render(item.question, item.pool.options) for item in items]
    return Evaluation(
        spec=spec,
        prompts=prompts,
        answers=[item.answer for item in items],
        params=run.params.model_copy(
            update={
                "max_tokens": spec.max_tokens or run.spec.sampling.max_tokens,
                "temperature": spec.temperature,
                "seed": spec.seed,
            }
        ),
        teachers=[run.scorer(item, prompt) for item, prompt in zip(items, prompts, strict=True)],
        answerers=[run.answerer(item, p) for item, p in zip(items, prompts, strict=True)],
        decode=run.decode,
        grade=grade,
        sources=[item.pool.name for item in items] if run.spec.several_datasets() else (),
    )


PHASES = ("sampler_refresh", "sample", "teacher", "rollout_wait", "train", "save")
"""Where a step's time goes: its `time/<phase>` metrics, in the order they are listed."""


class PhaseTimer:
    """Times a step's phases: `with timer("train"):` records the block's seconds, `record`
    a time measured elsewhere, and `lap()` hands over one step's phases and starts the
    next step's. A phase that did not run took 0 s; `save` is the checkpoint saved at the
    boundary before the step, so it is timed after the previous step's lap."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        start = time.perf_counter()
        yield
        self.record(phase, time.perf_counter() - start)

    def record(self, phase: str, seconds: float) -> None:
        self.seconds[phase] = seconds

    def lap(self) -> dict[str, float]:
        phases = {phase: self.seconds.get(phase, 0.0) for phase in PHASES}
        self.seconds = {}
        return phases


def first_step(loop: LoopSpec, resume: SavedState | None) -> int:
    """The step a run starts at: 0, or a saved state's, if the run can resume there
    exactly (with k >= 1 that needs the older sampler weights its next steps sample from)."""
    start = resume.step if resume else 0
    if not 0 <= start <= loop.steps:
        raise OPDError(
            f"cannot resume at step {start}: the run has {loop.steps} steps",
            code="bad_resume_state",
        )
    needed = resume_versions(start, loop) if resume and loop.max_steps_off_policy else set()
    if missing := sorted(needed - resume.samplers.keys() if resume else needed):
        raise OPDError(
            f"cannot resume at step {start}: its next steps sample from the sampler weights "
            f"saved after steps {missing}, which were not given",
            code="bad_resume_state",
        )
    return start


def checkpoint_due(loop: LoopSpec, done: int) -> bool:
    """Whether `loop.save_every` saves a checkpoint after `done` steps (the last boundary
    saves its own final weights)."""
    return bool(loop.save_every) and done % loop.save_every == 0 and done < loop.steps


@dataclass
class Steps:
    """A run from its first step boundary to its last: its clients, the rollouts in
    flight, the held-out eval, and the state it saved last."""

    run: Run
    rollouts: Rollouts
    evaluation: Evaluation | None
    grade: Grade | None
    latest: SavedState | None
    """The state of the latest boundary saved (or resumed from): a stop right there reuses
    it, since a state name may be saved only once in a run."""

    async def stop_if_asked(self, step: int, stop: Stop | None) -> RunResult | None:
        """Stop at this boundary if asked and able to (`Stop`); a stop to resume that
        cannot take effect yet keeps every new set of weights until it can."""
        if stop is Stop.cancel:
            return await self.stop_at(step, "Cancelled", {})
        if stop is Stop.resume:
            if self.rollouts.resumable_at(step):
                return await self.stop_at(step, "Stopped", self.rollouts.resume_weights(step))
            self.rollouts.keep_new_weights()
        return None

    async def stop_at(self, step: int, why: str, samplers: Mapping[int, str]) -> RunResult:
        """Stop at this boundary with its state, the rollouts in flight dropped."""
        await self.rollouts.close()
        latest = self.latest
        saved = latest if latest and latest.step == step else await self.run.save_state(step)
        self.run.sink.event(
            "info", f"{why} at step {step}; state saved", {"step": step, "path": saved.path}
        )
        state = SavedState(saved.path, step, samplers)
        return RunResult(steps_done=step, stopped=True, state=state)

    async def evaluate_if_due(self, step: int) -> dict[str, float]:
        """The held-out eval's metrics at this boundary, when one is due."""
        evaluation = self.evaluation
        if evaluation is None or not due(evaluation.spec, step, self.run.spec.loop.steps):
            return {}
        # The eval's scoring must not share the teacher's batches with a step's.
        async with self.rollouts.scoring:
            return await self.run.evaluate(evaluation, step)

    async def datums(self, batch: Batch, items: list[Item]) -> tuple[list[Datum], dict[str, float]]:
        """The step's datums, each token's advantage its negative reverse KL (plus the
        reward's bonus with `loop.reward`), and the reward's metrics."""
        loop = self.run.spec.loop
        bonus, rewarded = None, {}
        if loop.reward.coef:
            assert self.grade is not None
            rewards = await group_rewards(batch.completions, items, self.run.decode, self.grade)
            bonus = reward_bonus(batch.completions, rewards, loop.reward.coef)
            rewarded = reward_metrics(batch.completions, items, rewards)
        if loop.objective.logit_level:
            datums = logit_datums(batch.completions, bonus)
        else:
            datums = opd_datums(
                batch.completions, loop.kl_penalty_coef, loop.kl_discount_factor, bonus
            )
        if not datums:
            raise OPDError("No OPD datums were built: every completion was empty", code="no_datums")
        return datums, rewarded

    def record_samples(self, step: int, batch: Batch, items: list[Item]) -> None:
        """Keep a few of the step's rollouts for people to read, on the steps that keep them."""
        loop = self.run.spec.loop
        if keeps_samples(step, loop.steps, loop.keep_samples):
            kept = batch.completions[: loop.keep_samples]
            self.run.sink.samples(step, self.run.kept(kept, items))

    async def save_checkpoint(self, done: int) -> None:
        """The scheduled checkpoint after `done` steps; its sampler weights serve the
        rollouts too."""
        self.latest, sampler_path = await self.run.save_checkpoint(done)
        self.rollouts.saved_sampler(done, sampler_path)

    async def finish(self, stop: Stop | None) -> RunResult:
        """After the last step: the final eval, state and sampler weights (a cancel asked
        for during the last step keeps its state alone)."""
        run, loop = self.run, self.run.spec.loop
        if stop is Stop.cancel:
            return await self.stop_at(loop.steps, "Cancelled", {})
        if self.evaluation is not None:
            run.sink.eval(loop.steps, await run.evaluate(self.evaluation, loop.steps))
        if not (self.latest and self.latest.step == loop.steps):
            # A final state too, so that another job can continue this one (`init_from`).
            await run.save_state(loop.steps)
        final = await (await run.training.save_weights_for_sampler_async(run.spec.weights_name))
        run.sink.checkpoint(loop.steps, "final", final.path)
        run.sink.event("info", f"Saved weights: {final.path}", {"path": final.path})
        return RunResult(steps_done=loop.steps, final_weights_path=final.path)


async def run_loop(
    spec: JobSpec,
    service: ServiceClient,
    prompts: Prompts | Mapping[str, Prompts],
    sink: Sink,
    *,
    resume: SavedState | None = None,
    should_stop: Callable[[], Stop | None] = lambda: None,
    eval_prompts: Prompts | Mapping[str, Prompts] | None = None,
    grade: Grade | None = None,
) -> RunResult:
    """Run (or resume) one OPD job; stop early at a step boundary when asked (`Stop`): a
    cancel at the next one, a stop to resume as soon as the run can resume from there
    exactly (`Rollouts.resumable_at`). `prompts` (and `eval_prompts`) are by dataset name;
    a one-dataset spec may give its `Prompts` alone."""
    loop = spec.loop
    start = first_step(loop, resume)
    pools = training_pools(spec, prompts)
    if loop.reward.coef:
        require_answers(pools, grade)
    mix = Mix(pools, loop.batch_size)
    run = await open_run(spec, service, sink, resume, pools)
    try:
        evaluation = None
        if eval_prompts is not None:
            evaluation = evaluation_for(run, eval_pools(spec, eval_prompts), grade)
        await probe(run, pools, start)
        sink.start(RunInfo(spec=spec, dataset_size=len(mix), start_step=start))
        rollouts = Rollouts(
            spec,
            run.training,
            run.scorer,
            run.params,
            lambda item: run.render(item.question, item.pool.options),
            mix,
            sink,
            start=start,
            kept=resume.samplers if resume else {},
        )
        steps = Steps(run, rollouts, evaluation, grade, latest=resume)
        timer = PhaseTimer()
        try:
            for step in range(start, loop.steps):
                if stopped := await steps.stop_if_asked(step, should_stop()):
                    return stopped
                evaluated = await steps.evaluate_if_due(step)

                step_start = time.time()
                with timer("sampler_refresh"):
                    await rollouts.refresh(step)
                with timer("rollout_wait"):
                    batch = await rollouts.batch(step)
                timer.record("sample", batch.sample_seconds)
                timer.record("teacher", batch.teacher_seconds)
                items = rollouts.items_of(step)
                datums, rewarded = await steps.datums(batch, items)
                teachers = [run.teacher_shares(items[c.group].pool) for c in batch.completions]
                with timer("train"):
                    trained = await run.train(datums, teachers)
                if spec.trainer_scores():
                    batch = with_teacher_logprobs(batch, trained.loss_fn_outputs)
                trainer_metrics = dict(trained.metrics)
                phases = timer.lap()
                elapsed = time.time() - step_start
                metrics = step_metrics(
                    batch, items, trainer_metrics, spec.optim.learning_rate, step, elapsed, phases
                )
                sink.step(step, metrics | rewarded | evaluated)
                steps.record_samples(step, batch, items)

                if checkpoint_due(loop, step + 1):
                    with timer("save"):
                        await steps.save_checkpoint(step + 1)
        finally:
            await rollouts.close()
        return await steps.finish(should_stop())
    finally:  # a server teacher's connections
        await close_teachers(run.teachers)


async def run_job(
    spec: JobSpec,
    sink: Sink,
    *,
    artifact_dir: Path,
    data_root: Path,
    confine_data: bool = False,
    blobs: BlobCache | None = None,
    checkpoints: CheckpointStore | None = None,
    resume: SavedState | None = None,
    should_stop: Callable[[], Stop | None] = lambda: None,
) -> RunResult:
    """Load the prompts, open the backend (its checkpoints in `checkpoints`, a bucket, if
    given) and run the loop; the sink is always closed."""
    from worker.engine.backends import connect
    from worker.engine.datasets import load_datasets
    from worker.engine.eval.prompts import graded_prompts, load_eval_prompts, open_grader

    try:
        prompts = await asyncio.to_thread(load_datasets, spec, data_root, confine_data, blobs)
        for share in spec.dataset_shares():
            pool = prompts[share.name]
            several = f" (dataset {share.name})" if spec.several_datasets() else ""
            sink.event(
                "info",
                f"Loaded {len(pool)} prompts from {share.source}{several}",
                {"prompts": len(pool)} | ({"dataset": share.name} if several else {}),
            )
        eval_prompts: dict[str, Prompts] = {}
        if spec.eval is not None:
            eval_prompts = await asyncio.to_thread(
                load_eval_prompts, spec, data_root, confine_data, blobs
            )
        service = await asyncio.to_thread(
            connect, spec, artifact_dir, warning_to(sink), checkpoints
        )
        async with AsyncExitStack() as stack:
            graded = graded_prompts(spec, prompts, eval_prompts)
            grade = await stack.enter_async_context(open_grader(graded))
            return await run_loop(
                spec,
                service,
                prompts,
                sink,
                resume=resume,
                should_stop=should_stop,
                eval_prompts=eval_prompts if spec.eval is not None else None,
                grade=grade,
            )
    finally:
        sink.close()
