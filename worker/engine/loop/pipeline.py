"""The rollouts of the steps ahead, sampled in schedule order while earlier steps train.

`Rollouts` makes each step's sampler from the weights `schedule.sampler_version` names and
starts the step's sampling and scoring as soon as those weights exist. Steps in flight
sample concurrently but take turns at the teacher (`scoring`, with held-out evals): the
local backend batches the requests that arrive together, and what shares a batch can
change the last bits, so each batch is scored exactly as the on-policy loop scores it.

With k = `max_steps_off_policy` >= 1 each step gets a fresh sampler (a backend may seed a
request by its ordinal within its sampler) and a seed of its own. Weights that a resume
would sample from again are saved when they are made (`kept`): those a scheduled state
save needs, and, once a stop to resume was asked for, every new set, so the stop can take
effect (a cancel needs none: it stops at the next boundary).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

from pytrio.types import SamplingParams

from kernel.errors import OPDError
from kernel.spec import JobSpec
from worker.engine.backends.contract import SamplingClient, TrainingClient
from worker.engine.backends.vllm import VLLMSampler, VLLMServer
from worker.engine.data.mixing import Item, Mix
from worker.engine.loop.cold_start import cold_seed, reference_answers, teacher_answers
from worker.engine.loop.schedule import (
    kept_for_a_save,
    last_step_sampled_by,
    resume_versions,
    sampler_version,
    step_seed,
)
from worker.engine.rollouts.sampling import Batch, Draw, Scorer, sample_and_score
from worker.engine.teachers.views import Answerer
from worker.engine.tracking.sinks import Sink


def sampler_weights_name(spec: JobSpec, version: int) -> str:
    """The name sampler weights are saved under: the same as a scheduled checkpoint's."""
    return f"{spec.weights_name}-{version:06d}"


class Rollouts:
    """Every step's batch, from the sampler the schedule names, queued as soon as it can be."""

    def __init__(
        self,
        spec: JobSpec,
        training: TrainingClient,
        scorer_of: Callable[[Item, list[int], SamplingClient], Scorer],
        answerer_of: Callable[[Item, list[int], SamplingClient], Answerer],
        params: SamplingParams,
        render: Callable[[Item], list[int]],
        mix: Mix,
        sink: Sink,
        *,
        start: int,
        kept: Mapping[int, str],
        vllm: VLLMServer | None = None,
    ) -> None:
        self.spec, self.loop = spec, spec.loop
        self.training, self.scorer_of, self.answerer_of = training, scorer_of, answerer_of
        self.params, self.render, self.mix, self.sink = params, render, mix, sink
        self.kept = dict(kept)
        """Saved sampler weights by version (the optimizer steps they had taken)."""
        self.keep_all = False
        self.next_step = start
        self.scoring = asyncio.Lock()
        """Held by one batch's scoring (or one eval) at a time."""
        self.batches: dict[int, asyncio.Task[Batch]] = {}
        self.shared: dict[int, SamplingClient] = {}
        """k = 0: one sampler per refresh block, shared by its steps, as the reference does."""
        self.vllm = vllm
        """`sampling.engine: vllm`: the server each sampler version's adapter is loaded into."""

    def items_of(self, step: int) -> list[Item]:
        return self.mix.items(step)

    async def refresh(self, boundary: int) -> None:
        """At a step boundary (the weights have taken `boundary` steps), make the samplers
        of the steps that may start sampling now and start their rollouts."""
        for step in range(self.next_step, last_step_sampled_by(boundary, self.loop) + 1):
            version = sampler_version(step, self.loop)
            sampler = await self.sampler(step, version, boundary)
            self.batches[step] = asyncio.create_task(self.sample(step, sampler, version))
            self.next_step = step + 1

    async def batch(self, step: int) -> Batch:
        return await self.batches.pop(step)

    async def sampler(self, step: int, version: int, boundary: int) -> SamplingClient:
        if not self.loop.max_steps_off_policy:
            if version not in self.shared:
                self.shared = {version: await self.current_weights_sampler(version)}
            return self.shared[version]
        if version == boundary and (self.keep_all or kept_for_a_save(version, self.loop)):
            await self.keep(version)
        if version in self.kept:
            if self.vllm is not None:
                return await self.on_vllm(version, self.kept[version])
            return await self.training.create_sampling_client_async(self.kept[version])
        if version == boundary:
            return await self.current_weights_sampler(version)
        raise OPDError(
            f"cannot resume at step {boundary}: step {step} samples from the weights after "
            f"{version} steps, and no sampler weights saved then were given",
            code="bad_resume_state",
        )

    async def current_weights_sampler(self, version: int) -> SamplingClient:
        if self.vllm is None:
            return await self.training.save_weights_and_get_sampling_client_async()
        name = f"{self.spec.weights_name}-vllm-{version:06d}"
        saved = await (await self.training.save_weights_for_sampler_async(name))
        return await self.on_vllm(version, saved.path)

    async def on_vllm(self, version: int, path: str) -> SamplingClient:
        """The sampler of `version`'s adapter (saved at `path`) on the vLLM server; the
        versions no rollout in flight samples from any more are unloaded."""
        assert self.vllm is not None
        busy = {
            sampler_version(step, self.loop)
            for step, task in self.batches.items()
            if not task.done()
        }
        name = await self.vllm.load(version, path, busy)
        return VLLMSampler(self.vllm, name, self.training.get_tokenizer(), version)

    async def keep(self, version: int) -> None:
        """Save the current weights (`version` steps) for a resumed run to sample from."""
        if version in self.kept:
            return
        name = sampler_weights_name(self.spec, version)
        saved = await (await self.training.save_weights_for_sampler_async(name))
        self.sink.checkpoint(version, "sampler", saved.path)
        self.kept[version] = saved.path

    async def sample(self, step: int, sampler: SamplingClient, version: int) -> Batch:
        params = self.params
        if self.loop.max_steps_off_policy:
            params = params.model_copy(update={"seed": step_seed(params.seed, step)})
        items = self.items_of(step)
        prompts = [self.render(item) for item in items]
        return await sample_and_score(
            sampler,
            [
                self.scorer_of(item, prompt, sampler)
                for item, prompt in zip(items, prompts, strict=True)
            ],
            prompts,
            self.loop.group_size,
            params,
            version,
            self.scoring,
            self.spec.teacher_top_k(),
            scored=not self.spec.trainer_scores(),
            draw=self.borrowed(step, sampler, items, prompts, params),
        )

    def borrowed(
        self,
        step: int,
        sampler: SamplingClient,
        items: list[Item],
        prompts: list[list[int]],
        params: SamplingParams,
    ) -> Draw | None:
        """Where a cold start's step takes its completions (`loop.cold_start`): the
        teachers' answers or the reference answers, each teacher's request seeded by its
        step and prompt alone; None from the first on-policy step on (the student samples)."""
        cold = self.loop.cold_start
        tokenizer = self.training.get_tokenizer()
        if step >= cold.steps:
            return None
        if cold.source == "reference":
            return reference_answers(sampler, [item.answer for item in items], params, tokenizer)
        answerers = [
            self.answerer_of(item, prompt, sampler)
            for item, prompt in zip(items, prompts, strict=True)
        ]
        seeds = [cold_seed(params.seed, step, index) for index in range(len(items))]
        return teacher_answers(sampler, answerers, self.loop.group_size, params, tokenizer, seeds)

    def keep_new_weights(self) -> None:
        """A stop to resume later was asked for: save every set of weights made from now
        on, so that the stop can take effect as soon as a resumed run would need no
        others."""
        self.keep_all = True

    def resumable_at(self, boundary: int) -> bool:
        """Whether a run stopped at `boundary` resumes exactly from its state (and the kept
        weights): k = 0 at a sampler refresh, k >= 1 once every older weights its next
        steps sample from are saved."""
        if not self.loop.max_steps_off_policy:
            return boundary % self.loop.sampler_refresh_steps == 0
        return resume_versions(boundary, self.loop).issubset(self.kept)

    def resume_weights(self, boundary: int) -> dict[int, str]:
        """The saved sampler weights a run resumed at `boundary` samples from."""
        return {version: self.kept[version] for version in resume_versions(boundary, self.loop)}

    def saved_sampler(self, version: int, path: str) -> None:
        """Sampler weights a scheduled checkpoint saved: no need to save them again."""
        if self.loop.max_steps_off_policy:
            self.kept[version] = path

    async def close(self) -> None:
        """Drop the rollouts not trained on yet (a stop, a failure)."""
        for task in self.batches.values():
            task.cancel()
        await asyncio.gather(*self.batches.values(), return_exceptions=True)
        self.batches.clear()
