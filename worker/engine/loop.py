"""The OPD training loop (DESIGN §1), one readable function over the backend contract.

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
from collections.abc import Callable, Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

import numpy as np
from pytrio.types import AdamParams, Datum, SamplingParams

from kernel.errors import OPDError, TokenizerMismatch
from kernel.samples import MAX_PROMPT_CHARS, MAX_SAMPLE_TOKENS, KeptSample, keeps_samples
from kernel.spec import InitFrom, JobSpec, SavedWeights
from worker.engine.backends.contract import SamplingClient, ServiceClient, TrainingClient
from worker.engine.datasets import Prompts
from worker.engine.datums import build_prompt
from worker.engine.eval.evaluation import Evaluation, Grade, due, with_baseline
from worker.engine.pipeline import Rollouts, sampler_weights_name
from worker.engine.rollouts import Batch, Completion, opd_datums
from worker.engine.schedule import resume_versions
from worker.engine.sinks import RunInfo, Sink

RENDERED_KEPT = 4096


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
    return f"{spec.loop.save_weights_name}-state-{steps_done:06d}"


def check_tokenizers(student: Any, teacher: Any, student_model: str, teacher_model: str) -> None:
    """The teacher scores the student's token ids, so both must share one vocabulary."""
    if student.get_vocab() != teacher.get_vocab():
        raise TokenizerMismatch(
            f"student {student_model!r} and teacher {teacher_model!r} use different "
            f"vocabularies ({len(student.get_vocab())} vs {len(teacher.get_vocab())} tokens); "
            "OPD needs a teacher that shares the student's tokenizer"
        )


def stop_sequences(tokenizer: Any) -> list[str]:
    return list(dict.fromkeys(x for x in (tokenizer.eos_token, "<|im_end|>") if x))


def step_metrics(
    batch: Batch,
    trainer_metrics: dict[str, float],
    lr: float,
    step: int,
    elapsed: float,
    phases: dict[str, float],
) -> dict[str, float]:
    """The reference's metric names (DESIGN §1), `trainer/<name>` from the backend, how
    many optimizer steps old the rollouts were, and where the step's time went
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
        "usage/teacher_tokens": batch.scored_tokens,
        "usage/trained_tokens": batch.datum_tokens,
    }
    metrics.update({f"time/{name}": seconds for name, seconds in phases.items()})
    metrics.update({f"trainer/{k}": float(v) for k, v in trainer_metrics.items()})
    return metrics


@dataclass
class Run:
    """One run's clients and settings, made once before its first step."""

    spec: JobSpec
    training: TrainingClient
    teacher: SamplingClient
    tokenizer: Any
    params: SamplingParams
    adam: AdamParams
    sink: Sink
    rendered: dict[str, list[int]] = field(default_factory=dict)
    """Questions rendered recently: each step renders its own, and again for its samples."""

    async def train(self, datums: list[Datum]) -> dict[str, float]:
        """One forward_backward and one optim_step, both submitted before either is awaited."""
        loop = self.spec.loop
        fwd_bwd = await self.training.forward_backward_async(
            datums, loss_fn=loop.loss_fn, loss_fn_config=loop.loss_options()
        )
        optim = await self.training.optim_step_async(self.adam)
        result = await fwd_bwd
        await optim
        return dict(result.metrics)

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

    def kept(self, completions: list[Completion], questions: list[str]) -> list[KeptSample]:
        """Completions as people read them: the question, the text, each token's KL."""
        by_prompt = {tuple(prompt_tokens(self, q)): q for q in questions}
        decode = self.tokenizer.decode
        kept = []
        for completion in completions:
            tokens = completion.tokens[:MAX_SAMPLE_TOKENS]
            pieces = {token: decode([token]) for token in set(tokens)}
            kept.append(
                KeptSample(
                    prompt=by_prompt[tuple(completion.prompt)][:MAX_PROMPT_CHARS],
                    completion=decode(tokens, skip_special_tokens=True),
                    tokens=[pieces[token] for token in tokens],
                    reverse_kl=completion.reverse_kl[: len(tokens)].tolist(),
                    truncated=len(tokens) < len(completion.tokens),
                )
            )
        return kept

    async def evaluate(self, evaluation: Evaluation, step: int) -> dict[str, float]:
        """The student's eval at this boundary; at step 0 the teacher's baseline too."""
        metrics = await evaluation.student(self.training)
        if step == 0 and evaluation.spec.teacher_baseline:
            metrics = with_baseline(metrics, await evaluation.teacher_baseline())
        return metrics


async def open_run(
    spec: JobSpec, service: ServiceClient, sink: Sink, resume: SavedState | None
) -> Run:
    """Create the clients, restore a saved state, and check the tokenizers agree."""
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
    if spec.teacher.init_from is not None:
        service_filled(spec.teacher.init_from, "teacher.init_from")
    teacher = await service.create_sampling_client_async(
        base_model=spec.teacher.base_model, model_path=spec.teacher.weights()
    )
    teacher_tokenizer = await asyncio.to_thread(teacher.get_tokenizer)
    check_tokenizers(tokenizer, teacher_tokenizer, spec.student.base_model, spec.teacher.base_model)
    params = SamplingParams(
        max_tokens=spec.sampling.max_tokens,
        seed=spec.student.seed,
        temperature=spec.sampling.temperature,
        top_p=spec.sampling.top_p,
        top_k=spec.sampling.top_k,
        stop=stop_sequences(tokenizer),
    )
    return Run(
        spec, training, teacher, tokenizer, params, AdamParams(**spec.optim.model_dump()), sink
    )


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


def prompt_tokens(run: Run, question: str) -> list[int]:
    if question not in run.rendered:
        if len(run.rendered) >= RENDERED_KEPT:
            run.rendered.clear()
        dataset = run.spec.dataset
        run.rendered[question] = build_prompt(
            run.tokenizer, question, dataset.question_suffix, dataset.enable_thinking
        )
    return run.rendered[question]


def evaluation_for(run: Run, prompts: Prompts, grade: Grade | None) -> Evaluation:
    spec = run.spec.eval
    assert spec is not None
    source = spec.dataset or run.spec.dataset
    return Evaluation(
        spec=spec,
        prompts=[
            build_prompt(run.tokenizer, q, source.question_suffix, source.enable_thinking)
            for q in prompts.questions
        ],
        answers=prompts.answers,
        params=run.params.model_copy(
            update={
                "max_tokens": spec.max_tokens or run.spec.sampling.max_tokens,
                "temperature": spec.temperature,
                "seed": spec.seed,
            }
        ),
        teacher=run.teacher,
        decode=lambda tokens: run.tokenizer.decode(tokens, skip_special_tokens=True),
        grade=grade,
    )


async def run_loop(
    spec: JobSpec,
    service: ServiceClient,
    prompts: Prompts,
    sink: Sink,
    *,
    resume: SavedState | None = None,
    should_stop: Callable[[], Stop | None] = lambda: None,
    eval_prompts: Prompts | None = None,
    grade: Grade | None = None,
) -> RunResult:
    """Run (or resume) one OPD job; stop early at a step boundary when asked (`Stop`): a
    cancel at the next one, a stop to resume as soon as the run can resume from there
    exactly (`Rollouts.resumable_at`)."""
    loop = spec.loop
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
    run = await open_run(spec, service, sink, resume)
    evaluation = evaluation_for(run, eval_prompts, grade) if eval_prompts is not None else None
    sink.start(RunInfo(spec=spec, dataset_size=len(prompts), start_step=start))
    rollouts = Rollouts(
        spec,
        run.training,
        run.teacher,
        run.params,
        lambda question: prompt_tokens(run, question),
        prompts.questions,
        sink,
        start=start,
        kept=resume.samplers if resume else {},
    )
    # The state of the latest boundary saved (or resumed from): a stop right there reuses
    # it, since a state name may be saved only once in a run.
    latest = resume

    async def stopped_at(step: int, why: str, samplers: Mapping[int, str]) -> RunResult:
        """Stop at this boundary with its state, the rollouts in flight dropped."""
        await rollouts.close()
        saved = latest if latest and latest.step == step else await run.save_state(step)
        sink.event("info", f"{why} at step {step}; state saved", {"step": step, "path": saved.path})
        state = SavedState(saved.path, step, samplers)
        return RunResult(steps_done=step, stopped=True, state=state)

    save_seconds = 0.0
    try:
        for step in range(start, loop.steps):
            stop = should_stop()
            if stop is Stop.cancel:
                return await stopped_at(step, "Cancelled", {})
            if stop is Stop.resume:
                if rollouts.resumable_at(step):
                    return await stopped_at(step, "Stopped", rollouts.resume_weights(step))
                rollouts.keep_new_weights()
            evaluated = {}
            if evaluation is not None and due(evaluation.spec, step, loop.steps):
                # The eval's scoring must not share the teacher's batches with a step's.
                async with rollouts.scoring:
                    evaluated = await run.evaluate(evaluation, step)

            step_start = time.time()
            phase = time.perf_counter()
            await rollouts.refresh(step)
            refresh_seconds = time.perf_counter() - phase
            phase = time.perf_counter()
            batch = await rollouts.batch(step)
            wait_seconds = time.perf_counter() - phase
            datums = opd_datums(batch.completions, loop.kl_penalty_coef, loop.kl_discount_factor)
            if not datums:
                raise OPDError(
                    "No OPD datums were built: every completion was empty", code="no_datums"
                )
            phase = time.perf_counter()
            trainer_metrics = await run.train(datums)
            phases = {
                "sampler_refresh": refresh_seconds,
                "sample": batch.sample_seconds,
                "teacher": batch.teacher_seconds,
                "rollout_wait": wait_seconds,
                "train": time.perf_counter() - phase,
                "save": save_seconds,
            }
            elapsed = time.time() - step_start
            metrics = step_metrics(
                batch, trainer_metrics, spec.optim.learning_rate, step, elapsed, phases
            )
            sink.step(step, metrics | evaluated)
            if keeps_samples(step, loop.steps, loop.keep_samples):
                kept = batch.completions[: loop.keep_samples]
                sink.samples(step, run.kept(kept, rollouts.questions_of(step)))

            done = step + 1
            save_seconds = 0.0
            if loop.save_every and done % loop.save_every == 0 and done < loop.steps:
                phase = time.perf_counter()
                latest, sampler_path = await run.save_checkpoint(done)
                rollouts.saved_sampler(done, sampler_path)
                save_seconds = time.perf_counter() - phase
    finally:
        await rollouts.close()

    if should_stop() is Stop.cancel:
        return await stopped_at(loop.steps, "Cancelled", {})
    if evaluation is not None:
        sink.eval(loop.steps, await run.evaluate(evaluation, loop.steps))
    if not (latest and latest.step == loop.steps):
        # A final state too, so that another job can continue this one (`init_from`).
        await run.save_state(loop.steps)
    final = await (await run.training.save_weights_for_sampler_async(loop.save_weights_name))
    sink.checkpoint(loop.steps, "final", final.path)
    sink.event("info", f"Saved weights: {final.path}", {"path": final.path})
    return RunResult(steps_done=loop.steps, final_weights_path=final.path)


async def run_job(
    spec: JobSpec,
    sink: Sink,
    *,
    artifact_dir: Path,
    data_root: Path,
    confine_data: bool = False,
    resume: SavedState | None = None,
    should_stop: Callable[[], Stop | None] = lambda: None,
) -> RunResult:
    """Load the prompts, open the backend and run the loop; the sink is always closed."""
    from worker.engine.backends import connect
    from worker.engine.datasets import load_prompts
    from worker.engine.eval.prompts import load_eval_prompts, open_grader

    try:
        prompts = await asyncio.to_thread(load_prompts, spec.dataset, data_root, confine_data)
        sink.event(
            "info",
            f"Loaded {len(prompts)} prompts from {spec.dataset.source}",
            {"prompts": len(prompts)},
        )
        eval_prompts = None
        if spec.eval is not None:
            eval_prompts = await asyncio.to_thread(load_eval_prompts, spec, data_root, confine_data)
        service = await asyncio.to_thread(
            connect, spec, artifact_dir, lambda message, data: sink.event("warning", message, data)
        )
        async with AsyncExitStack() as stack:
            grade = await stack.enter_async_context(open_grader(eval_prompts))
            return await run_loop(
                spec,
                service,
                prompts,
                sink,
                resume=resume,
                should_stop=should_stop,
                eval_prompts=eval_prompts,
                grade=grade,
            )
    finally:
        sink.close()
