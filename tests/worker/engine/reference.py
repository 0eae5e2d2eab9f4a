"""The on-policy loop as it was before the pipeline, written out step by step
(docs/algorithm.md#one-step): what `loop.max_steps_off_policy: 0` must still compute, datum
for datum."""

from __future__ import annotations

from pytrio.types import AdamParams, Datum, SamplingParams

from kernel.spec import JobSpec
from worker.engine.backends.contract import ServiceClient, TrainingClient
from worker.engine.data.mixing import batch_indices
from worker.engine.data.prompts import build_prompt
from worker.engine.rollouts.sampling import opd_datums, sample_and_score, stop_sequences
from worker.engine.teachers.scoring import Prompted


async def reference_run(
    spec: JobSpec, service: ServiceClient, questions: list[str]
) -> tuple[TrainingClient, list[list[Datum]]]:
    """Train `spec.loop.steps` steps; returns the training client and each step's datums."""
    loop, dataset = spec.loop, spec.dataset
    training = await service.create_lora_training_client_async(
        base_model=spec.student.base_model, rank=spec.student.lora_rank, seed=spec.student.seed
    )
    tokenizer = training.get_tokenizer()
    teacher = await service.create_sampling_client_async(base_model=spec.teacher.base_model)
    params = SamplingParams(
        max_tokens=spec.sampling.max_tokens,
        seed=spec.student.seed,
        temperature=spec.sampling.temperature,
        top_p=spec.sampling.top_p,
        top_k=spec.sampling.top_k,
        stop=stop_sequences(tokenizer),
    )
    sent = []
    for step in range(loop.steps):
        if step % loop.sampler_refresh_steps == 0:
            sampler = await training.save_weights_and_get_sampling_client_async()
        rows = [questions[i] for i in batch_indices(step, loop.batch_size, len(questions))]
        prompts = [
            build_prompt(tokenizer, row, dataset.question_suffix, dataset.enable_thinking)
            for row in rows
        ]
        scorers = [Prompted("teacher", teacher, prompt) for prompt in prompts]
        batch = await sample_and_score(sampler, scorers, prompts, loop.group_size, params)
        datums = opd_datums(batch.completions, loop.kl_penalty_coef, loop.kl_discount_factor)
        fwd_bwd = await training.forward_backward_async(
            datums, loss_fn=loop.loss_fn, loss_fn_config=loop.loss_options()
        )
        optim = await training.optim_step_async(AdamParams(**spec.optim.model_dump()))
        await fwd_bwd
        await optim
        sent.append(datums)
    return training, sent
