"""The OPD training loop (DESIGN §1), one readable function over a PyTRIO-shaped backend.

Per step: refresh the sampler, sample `group_size` completions for each of the step's
prompts concurrently, let the teacher score every completion concurrently, build the
datums, then `forward_backward` and `optim_step`. The prompt order is a function of the
step and the backend's training state carries its RNG, so a run resumed from the state
saved after k steps reproduces steps k..N of an uninterrupted run.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from pytrio.types import AdamParams, Datum, ModelInput, SamplingParams

from kernel.errors import BackendFailure, OPDError, TokenizerMismatch
from kernel.spec import JobSpec
from worker.engine.backends.contract import SamplingClient, ServiceClient, TrainingClient
from worker.engine.datums import (
    batch_indices,
    build_opd_datum,
    build_prompt,
    completion_slice,
    kl_advantages,
)
from worker.engine.sinks import RunInfo, Sink

STATE_STEP = re.compile(r"-state-(\d+)/?$")


@dataclass(frozen=True)
class RunResult:
    steps_done: int
    stopped: bool = False
    final_weights_path: str | None = None
    state_path: str | None = None


@dataclass
class Rollout:
    """What one prompt's group contributes to a step."""

    datums: list[Datum] = field(default_factory=list)
    reverse_kls: list[float] = field(default_factory=list)
    token_counts: list[int] = field(default_factory=list)


def state_name(spec: JobSpec, steps_done: int) -> str:
    return f"{spec.loop.save_weights_name}-state-{steps_done:06d}"


def steps_done_of_state(path: str) -> int:
    """The step a saved state resumes at, read from the name `state_name` gave it."""
    match = STATE_STEP.search(path)
    if match is None:
        raise OPDError(
            f"cannot tell which step the state {path!r} was saved at: resume from a path "
            "the run recorded as a 'state' checkpoint (its name ends in -state-NNNNNN)",
            code="bad_resume_state",
        )
    return int(match.group(1))


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


async def teacher_logprobs(teacher: SamplingClient, prompt: list[int], completion: list[int]):
    all_logprobs = await teacher.compute_logprobs_async(ModelInput.from_ints(prompt + completion))
    return completion_slice(all_logprobs, len(prompt), len(completion))


async def rollout(
    sampler: SamplingClient,
    teacher: SamplingClient,
    prompt_ids: list[int],
    params: SamplingParams,
    spec: JobSpec,
) -> Rollout:
    """Sample one prompt's group and score every completion with the teacher."""
    result = await sampler.sample_async(
        prompt=ModelInput.from_ints(prompt_ids),
        num_samples=spec.loop.group_size,
        sampling_params=params,
        return_text=False,
    )
    sequences = [seq for seq in result.sequences if seq.tokens]
    scores = await asyncio.gather(
        *(teacher_logprobs(teacher, prompt_ids, seq.tokens) for seq in sequences)
    )
    out = Rollout()
    for seq, teacher_lps in zip(sequences, scores, strict=True):
        student_lps = [float(v) for v in seq.logprobs]
        if len(student_lps) != len(seq.tokens):
            raise BackendFailure(
                f"Student token/logprob length mismatch: {len(seq.tokens)} != {len(student_lps)}",
                code="bad_sampler_logprobs",
            )
        reverse_kl, advantages = kl_advantages(
            student_lps, teacher_lps, spec.loop.kl_penalty_coef, spec.loop.kl_discount_factor
        )
        out.datums.append(build_opd_datum(prompt_ids, seq.tokens, student_lps, advantages))
        out.reverse_kls.extend(reverse_kl.tolist())
        out.token_counts.append(len(seq.tokens))
    return out


def step_metrics(
    rollouts: Sequence[Rollout],
    trainer_metrics: dict[str, float],
    lr: float,
    step: int,
    elapsed: float,
) -> dict[str, float]:
    """The reference's metric names (DESIGN §1), plus trainer/<name> from the backend."""
    counts = [n for r in rollouts for n in r.token_counts]
    kls = [v for r in rollouts for v in r.reverse_kls]
    total = int(sum(counts))
    metrics: dict[str, float] = {
        "data/datums": sum(len(r.datums) for r in rollouts),
        "data/completion_tokens_mean": float(np.mean(counts)),
        "data/completion_tokens_total": total,
        "data/completion_tokens_per_second": total / elapsed,
        "opd/reverse_kl_mean": float(np.mean(kls)),
        "opd/reverse_kl_std": float(np.std(kls)),
        "train/learning_rate": lr,
        "train/step": step,
        "time/step_elapsed_time": elapsed,
    }
    metrics.update({f"trainer/{k}": float(v) for k, v in trainer_metrics.items()})
    return metrics


async def save_state(training: TrainingClient, spec: JobSpec, steps_done: int, sink: Sink) -> str:
    saved = await (await training.save_state_async(state_name(spec, steps_done)))
    sink.checkpoint(steps_done, "state", saved.path)
    return saved.path


async def run_loop(
    spec: JobSpec,
    service: ServiceClient,
    prompts: Sequence[str],
    sink: Sink,
    *,
    resume_from: str | None = None,
    should_stop: Callable[[], bool] = lambda: False,
) -> RunResult:
    """Run (or resume) one OPD job; stop early at a sampler-refresh boundary when asked."""
    loop = spec.loop
    start = steps_done_of_state(resume_from) if resume_from else 0
    if start > loop.steps:
        raise OPDError(
            f"state {resume_from!r} is past the run's {loop.steps} steps", code="bad_resume_state"
        )

    training = await service.create_lora_training_client_async(
        base_model=spec.student.base_model, rank=spec.student.lora_rank, seed=spec.student.seed
    )
    if resume_from:
        # PyTRIO accepts load_state only before the first training operation.
        await (await training.load_state_with_optimizer_async(resume_from))
        sink.event(
            "info",
            f"Resumed from {resume_from} at step {start}",
            {"step": start, "path": resume_from},
        )
    tokenizer = training.get_tokenizer()
    teacher = await service.create_sampling_client_async(
        base_model=spec.teacher.base_model,
        model_path=spec.teacher.model_path,
    )
    check_tokenizers(
        tokenizer, teacher.get_tokenizer(), spec.student.base_model, spec.teacher.base_model
    )

    params = SamplingParams(
        max_tokens=spec.sampling.max_tokens,
        seed=spec.student.seed,
        temperature=spec.sampling.temperature,
        top_p=spec.sampling.top_p,
        top_k=spec.sampling.top_k,
        stop=stop_sequences(tokenizer),
    )
    adam = AdamParams(**spec.optim.model_dump())
    suffix, thinking = spec.dataset.question_suffix, spec.dataset.enable_thinking
    sink.start(RunInfo(spec=spec, dataset_size=len(prompts), start_step=start))

    sampler: SamplingClient | None = None
    # The state of the latest step boundary saved (or resumed from): a stop right there reuses
    # it, since a state name may be saved only once in a run.
    latest_state = (start, resume_from) if resume_from else None
    for step in range(start, loop.steps):
        on_refresh_boundary = step % loop.sampler_refresh_steps == 0
        if on_refresh_boundary and should_stop():
            if latest_state is not None and latest_state[0] == step:
                path = latest_state[1]
            else:
                path = await save_state(training, spec, step, sink)
            sink.event("info", f"Stopped at step {step}; state saved", {"step": step, "path": path})
            return RunResult(steps_done=step, stopped=True, state_path=path)

        step_start = time.time()
        if sampler is None or on_refresh_boundary:
            sampler = await training.save_weights_and_get_sampling_client_async()

        rows = [prompts[i] for i in batch_indices(step, loop.batch_size, len(prompts))]
        rollouts = await asyncio.gather(
            *(
                rollout(
                    sampler, teacher, build_prompt(tokenizer, row, suffix, thinking), params, spec
                )
                for row in rows
            )
        )
        datums = [d for r in rollouts for d in r.datums]
        if not datums:
            raise OPDError("No OPD datums were built: every completion was empty", code="no_datums")

        fwd_bwd = await training.forward_backward_async(datums, loss_fn=loop.loss_fn)
        optim = await training.optim_step_async(adam)
        fwd_bwd_result = await fwd_bwd
        await optim

        metrics = step_metrics(
            rollouts,
            fwd_bwd_result.metrics,
            spec.optim.learning_rate,
            step,
            time.time() - step_start,
        )
        sink.step(step, metrics)

        done = step + 1
        if loop.save_every and done % loop.save_every == 0 and done < loop.steps:
            latest_state = (done, await save_state(training, spec, done, sink))
            saved = await (
                await training.save_weights_for_sampler_async(
                    f"{loop.save_weights_name}-{done:06d}"
                )
            )
            sink.checkpoint(done, "sampler", saved.path)

    final = await (await training.save_weights_for_sampler_async(loop.save_weights_name))
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
    resume_from: str | None = None,
    should_stop: Callable[[], bool] = lambda: False,
) -> RunResult:
    """Load the prompts, open the backend and run the loop; the sink is always closed."""
    from worker.engine.backends import connect
    from worker.engine.datasets import load_prompts

    try:
        prompts = await asyncio.to_thread(load_prompts, spec.dataset, data_root, confine_data)
        sink.event(
            "info",
            f"Loaded {len(prompts)} prompts from {spec.dataset.source}",
            {"prompts": len(prompts)},
        )
        service = await asyncio.to_thread(
            connect, spec, artifact_dir, lambda message, data: sink.event("warning", message, data)
        )
        return await run_loop(
            spec, service, prompts, sink, resume_from=resume_from, should_stop=should_stop
        )
    finally:
        sink.close()
