"""Before step 0, with several teachers or one of another tokenizer: one completion of each
dataset's first prompt scored by every teacher, reported as events.
"""

from __future__ import annotations

import asyncio

import numpy as np

from worker.engine.data.mixing import Pool
from worker.engine.loop.metrics import aligned_fraction
from worker.engine.loop.run import Run, mode_event, teacher_named
from worker.engine.rollouts.sampling import sample_and_score


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
