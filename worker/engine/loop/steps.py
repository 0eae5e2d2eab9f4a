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

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pytrio.types import Datum

from kernel.errors import OPDError
from kernel.samples import keeps_samples
from kernel.spec import JobSpec
from worker.engine.backends.contract import ServiceClient
from worker.engine.backends.server import ServerKey
from worker.engine.data.mixing import Item, Mix, Pool, training_pools
from worker.engine.data.prompts import Prompts
from worker.engine.eval.evaluation import Evaluation, Grade, due
from worker.engine.eval.reward import group_rewards, require_answers, reward_bonus, reward_metrics
from worker.engine.loop.metrics import (
    OUTSIDE_FRACTION,
    PhaseTimer,
    sampler_logprob_diff,
    step_metrics,
    teacher_tier_metrics,
)
from worker.engine.loop.pace import Pace
from worker.engine.loop.pipeline import Rollouts
from worker.engine.loop.probe import check_sampler, probe
from worker.engine.loop.run import Run, close_teachers, eval_pools, evaluation_for, open_run
from worker.engine.loop.state import RunResult, SavedState, Stop, checkpoint_due, first_step
from worker.engine.rollouts.sampling import Batch, logit_datums, opd_datums, with_teacher_logprobs
from worker.engine.tracking.sinks import RunInfo, Sink

DISAGREEING = 0.05
"""The fraction of a step's tokens out of the ratio's bound past which the job is told."""


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
    pace: Pace
    timer: PhaseTimer = field(default_factory=PhaseTimer)
    noted_sampler: bool = False
    """Whether the run has noted a sampler that disagrees with its trainer (once a run)."""

    @classmethod
    async def open(
        cls,
        run: Run,
        pools: list[Pool],
        start: int,
        resume: SavedState | None,
        eval_prompts: Prompts | Mapping[str, Prompts] | None,
        grade: Grade | None,
    ) -> Steps:
        """The steps of an opened run from `start`: its held-out eval, the probe before
        step 0, and the rollouts (with the sampler weights a resumed run kept)."""
        spec = run.spec
        evaluation = None
        if eval_prompts is not None:
            evaluation = evaluation_for(run, eval_pools(spec, eval_prompts), grade)
        await probe(run, pools, start)
        await check_sampler(run, pools)
        mix = Mix(pools, spec.loop.batch_size)
        run.sink.start(RunInfo(spec=spec, dataset_size=len(mix), start_step=start))
        announce_cold_start(run, start)
        rollouts = Rollouts(
            spec,
            run.training,
            run.scorer,
            run.answerer,
            run.params,
            lambda item: run.render(item.prompt, item.pool.options),
            mix,
            run.sink,
            start=start,
            kept=resume.samplers if resume else {},
            vllm=run.vllm,
        )
        pace = Pace(
            spec.loop.steps,
            spec.eval if evaluation is not None else None,
            evaluation.size if evaluation is not None else lambda step: 0,
        )
        return cls(run, rollouts, evaluation, grade, latest=resume, pace=pace)

    async def take(self, step: int) -> None:
        """One step: the eval due at its boundary, the step's rollouts (sampled, scored by
        the teachers), its datums, one forward_backward and optim_step, its metrics and
        kept samples, then the checkpoint due after it."""
        run, timer, pace = self.run, self.timer, self.pace
        evaluated = await self.evaluate_if_due(step)

        run.sink.progress(pace.training(step))
        began = pace.clock()
        step_start = time.time()
        with timer("sampler_refresh"):
            await self.rollouts.refresh(step)
        with timer("rollout_wait"):
            batch = await self.rollouts.batch(step)
        timer.record("sample", batch.sample_seconds)
        timer.record("teacher", batch.teacher_seconds)
        items = self.rollouts.items_of(step)
        datums, rewarded = await self.datums(batch, items)
        teachers = [list(c.teachers) for c in batch.completions]
        with timer("train"):
            trained = await run.train(datums, teachers)
        if run.spec.trainer_scores():
            batch = with_teacher_logprobs(batch, trained.loss_fn_outputs)
        trainer_metrics = dict(trained.metrics)
        phases = timer.lap()
        elapsed = time.time() - step_start
        learning_rate = run.spec.optim.learning_rate
        metrics = step_metrics(batch, items, trainer_metrics, learning_rate, step, elapsed, phases)
        metrics |= teacher_tier_metrics(run.teachers.values())
        correction = run.spec.loop.sampler_correction
        if run.vllm is not None or correction.active:
            disagreed = sampler_logprob_diff(batch, trained.loss_fn_outputs, correction.c)
            self.note_a_disagreeing_sampler(step, disagreed.get(OUTSIDE_FRACTION, 0.0))
            metrics |= disagreed
        run.sink.step(step, metrics | rewarded | evaluated)
        self.record_samples(step, batch, items)

        if checkpoint_due(run.spec.loop, step + 1):
            with timer("save"):
                await self.save_checkpoint(step + 1)
        pace.trained(pace.clock() - began)

    def note_a_disagreeing_sampler(self, step: int, outside: float) -> None:
        """A note (a warning event the job page shows at its top), once a run, when more
        of a step's tokens than `DISAGREEING` have a trainer/sampler ratio out of bounds:
        the sampler is not the policy being trained, and what the step does with them
        (`loop.sampler_correction`) decides whether it still learns."""
        if self.noted_sampler or outside <= DISAGREEING:
            return
        self.noted_sampler = True
        correction = self.run.spec.loop.sampler_correction
        done = {
            "none": "trained as they came (loop.sampler_correction: none)",
            "truncate": "their ratio truncated",
            "mask": "masked",
        }[correction.kind]
        self.run.sink.event(
            "warning",
            f"{outside:.0%} of step {step}'s completion tokens have a trainer/sampler "
            f"probability ratio outside [1/{correction.c:g}, {correction.c:g}], {done}: the "
            "sampler disagrees with the trainer (another engine, precision or weights)",
            {"note": "sampler_mismatch", "step": step, "fraction": outside},
        )

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
        if not await self.budget_allows(evaluation, step):
            return {}
        # The eval's scoring must not share the teacher's batches with a step's.
        async with self.rollouts.scoring:
            return await self.evaluate(evaluation, step)

    async def budget_allows(self, evaluation: Evaluation, step: int) -> bool:
        """Whether the eval after `step` steps, a unit of spending as a step is, fits what
        the job's team may still spend (its most asked before it starts); else it is
        skipped, with an event saying so, and the steps go on under their own checks."""
        most = evaluation.most_tokens(step, self.run.spec.readers())
        if await self.run.sink.may_spend(most):
            return True
        self.run.sink.event(
            "warning",
            f"Skipped the eval after step {step}: it may use up to {most:,} tokens, more than "
            "the team's budget has left",
            {"eval": "skipped", "step": step, "tokens": most},
        )
        return False

    async def evaluate(self, evaluation: Evaluation, step: int) -> dict[str, float]:
        """The held-out eval after `step` steps, told as it goes: an event as it starts and
        one as it ends (with its figures), and its progress prompt by prompt (a real
        model's eval takes minutes)."""
        sink, pace = self.run.sink, self.pace
        total = evaluation.size(step)
        baseline = " (the teacher's baseline among them)" if total > len(evaluation.prompts) else ""
        sink.event(
            "info",
            f"Evaluating after step {step}: {total} held-out prompts to answer{baseline}",
            {"eval": "started", "step": step, "prompts": total},
        )
        answered = 0

        def one_more() -> None:
            nonlocal answered
            answered += 1
            sink.progress(pace.evaluating(step, answered))

        sink.progress(pace.evaluating(step, 0))
        metrics = await self.run.evaluate(evaluation, step, one_more)
        seconds = pace.evaluated(step)
        sink.event(
            "info",
            f"Evaluated after step {step} in {seconds:.0f} s: {eval_figures(metrics)}",
            {"eval": "finished", "step": step, "seconds": seconds},
        )
        return metrics

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
        if self.evaluation is not None and await self.budget_allows(self.evaluation, loop.steps):
            run.sink.eval(loop.steps, await self.evaluate(self.evaluation, loop.steps))
        if not (self.latest and self.latest.step == loop.steps):
            # A final state too, so that another job can continue this one (`init_from`).
            await run.save_state(loop.steps)
        final = await (await run.training.save_weights_for_sampler_async(run.spec.weights_name))
        run.sink.checkpoint(loop.steps, "final", final.path)
        # The text names no folder: a team reads it (the path is in the data, for admins).
        run.sink.event(
            "info", f"Saved the final weights at step {loop.steps}", {"path": final.path}
        )
        return RunResult(steps_done=loop.steps, final_weights_path=final.path)


def announce_cold_start(run: Run, start: int) -> None:
    """An event naming the steps of a cold start still to come (`loop.cold_start`)."""
    cold, steps = run.spec.loop.cold_start, run.spec.loop.steps
    if start >= min(cold.steps, steps):
        return
    last = min(cold.steps, steps) - 1
    whose = "the teacher's answers" if cold.source == "teacher" else "the reference answers"
    run.sink.event(
        "info",
        f"Steps {start} to {last} train on {whose} (loop.cold_start)",
        {"cold_start": {"from": start, "to": last, "source": cold.source}},
    )


def eval_figures(metrics: dict[str, float]) -> str:
    """An eval's headline figures, as its end event says them."""
    shown = [
        f"{name} {metrics[key]:{form}}"
        for key, name, form in (
            ("eval/accuracy", "accuracy", ".0%"),
            ("eval/reverse_kl_mean", "reverse KL", ".4f"),
            ("eval/teacher_accuracy", "teacher's accuracy", ".0%"),
        )
        if key in metrics
    ]
    return ", ".join(shown)


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
    server_keys: Mapping[str, ServerKey] | None = None,
    server_replicas: Mapping[str, Sequence[str]] | None = None,
    vllm_servers: Mapping[str, Sequence[str]] | None = None,
    job_folder: Path | None = None,
) -> RunResult:
    """Run (or resume) one OPD job; stop early at a step boundary when asked (`Stop`): a
    cancel at the next one, a stop to resume as soon as the run can resume from there
    exactly (`Rollouts.resumable_at`), once the sink has settled (`Sink.settled`).
    `server_keys`: the key the operator bound to each teacher server, by URL, and
    `server_replicas` the replicas behind it (a teacher tier);
    `vllm_servers`: the vLLM servers of each base model (`sampling.engine: vllm`, the
    first OPD_VLLM_SERVERS' and any more its replicas), where the job's adapters are named
    after `job_folder` (its artifact folder).
    `prompts` (and `eval_prompts`) are by dataset name; a one-dataset spec may give its
    `Prompts` alone."""
    loop = spec.loop
    start = first_step(loop, resume)
    pools = training_pools(spec, prompts)
    if loop.reward.coef:
        require_answers(pools, grade)
    run = await open_run(
        spec, service, sink, resume, pools, server_keys, vllm_servers, job_folder, server_replicas
    )
    try:
        steps = await Steps.open(run, pools, start, resume, eval_prompts, grade)
        try:
            for step in range(start, loop.steps):
                await run.sink.settled()
                if stopped := await steps.stop_if_asked(step, should_stop()):
                    return stopped
                await steps.take(step)
        finally:
            await steps.rollouts.close()
        await run.sink.settled()
        return await steps.finish(should_stop())
    finally:  # a server teacher's connections, the adapters loaded into vLLM
        await close_teachers(run.teachers)
        if run.vllm is not None:
            await run.vllm.aclose()
