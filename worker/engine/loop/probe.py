"""Before step 0, with several teachers or one of another tokenizer: one completion of each
dataset's first prompt scored by every teacher, reported as events; with the vLLM sampling
engine, the check that the server reads the student's weights as the trainer does.
"""

from __future__ import annotations

import asyncio

import numpy as np
from pytrio.types import ModelInput

from kernel.errors import OPDError
from kernel.spec import JobSpec
from worker.engine.backends.vllm import VLLMSampler
from worker.engine.data.mixing import Item, Pool
from worker.engine.loop.metrics import aligned_fraction
from worker.engine.loop.run import Run, mode_event, teacher_named
from worker.engine.rollouts.sampling import Scorer, sample_and_score
from worker.engine.teachers.views import TeacherView


async def probe(run: Run, pools: list[Pool], start: int) -> None:
    """Before step 0, with several teachers or one with another tokenizer: one completion
    of each dataset's first prompt, from a sampler of its own, scored by every teacher
    (each after its own rendering of the prompt; one that reads feedback, only where the
    dataset has it). Events: each cross-tokenizer teacher's
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
    firsts = [Item(pool.prompts.prompts[0], pool.prompts.answers[0], pool) for pool in pools]
    prompts = [run.render(item.prompt, item.pool.options) for item in firsts]

    def prompted(view: TeacherView, item: Item, prompt: list[int]) -> Scorer:
        return view.prompted(item.prompt, item.pool.options, prompt, item.answer, sampler)

    def probing(item: Item) -> list[str]:
        return [name for name in run.teachers if probes(spec, name, item.pool)]

    scorers = [
        prompted(run.teachers[probing(item)[0]], item, p)
        for item, p in zip(firsts, prompts, strict=True)
    ]
    completions = (await sample_and_score(sampler, scorers, prompts, 1, run.params)).completions
    kls: dict[str, float | None] = {}
    for name, view in run.teachers.items():
        scoring = [c for c in completions if name in probing(firsts[c.group])]
        scored = await asyncio.gather(
            *(
                prompted(view, firsts[c.group], c.prompt).score(c.tokens, c.student_logprobs)
                for c in scoring
            )
        )
        kl = [
            np.subtract(c.student_logprobs, s.logprobs)
            for c, s in zip(scoring, scored, strict=True)
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


def probes(spec: JobSpec, name: str, pool: Pool) -> bool:
    """Whether teacher `name` scores the probe's completion of the pool's first prompt:
    every teacher does, but one that reads feedback only a pool that has it (stored
    completions): another pool's prompts have none to read."""
    context = spec.teacher_specs()[name].self
    return context is None or context.context != "feedback" or pool.prompts.feedback is not None


SAMPLER_TOLERANCE = 1e-3
"""The largest difference between the vLLM sampler's and the trainer's logprob of a probe
token a job accepts: the importance ratio needs both to read the weights alike (float32 on
the CPU differs by about 2e-5)."""


async def check_sampler(run: Run, pools: list[Pool]) -> None:
    """With `sampling.engine: vllm`: the first prompt scored by the current weights on the
    vLLM server and in the trainer's backend; a job whose two disagree beyond
    SAMPLER_TOLERANCE fails before its first step (`sampler_mismatch`, with the figures)."""
    if run.vllm is None or not pools:
        return
    prompt = ModelInput.from_ints(run.render(pools[0].prompts.prompts[0], pools[0].options))
    name = f"{run.spec.weights_name}-vllm-probe"
    saved = await (await run.training.save_weights_for_sampler_async(name))
    served = VLLMSampler(run.vllm, await run.vllm.load(-1, saved.path, set()), run.tokenizer)
    local = await run.training.save_weights_and_get_sampling_client_async()
    theirs, ours = await asyncio.gather(
        served.compute_logprobs_async(prompt), local.compute_logprobs_async(prompt)
    )
    difference = float(np.abs(np.subtract(theirs[1:], ours[1:], dtype=np.float64)).max())
    figures = {"max_abs_difference": difference, "tolerance": SAMPLER_TOLERANCE}
    if difference > SAMPLER_TOLERANCE:
        raise OPDError(
            f"{run.vllm.who} scores a probe prompt unlike the trainer (max |logprob "
            f"difference| {difference:.3g} > {SAMPLER_TOLERANCE:g}): it must serve the "
            "student's base model in float32 with its adapters (opd vllm serve), or use "
            "sampling.engine: local",
            code="sampler_mismatch",
        )
    run.sink.event(
        "info",
        f"Sampling on {run.vllm.who}: a probe's logprobs agree with the trainer's "
        f"(max |difference| {difference:.2g}, at most {SAMPLER_TOLERANCE:g})",
        figures,
    )
