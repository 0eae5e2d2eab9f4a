"""`loop.max_steps_off_policy` against the PyTRIO fake: k = 0 sends the datums the on-policy
loop sent, k >= 1 samples the next steps while one trains and never trains on rollouts more
than k optimizer steps old, and a stopped or crashed run resumes exactly."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from kernel.errors import OPDError
from kernel.spec import JobSpec
from tests.fakes.sinks import RecordingSink
from tests.fakes.trio import FakeServiceClient, FakeTrainingClient
from tests.worker.engine.reference import reference_run
from worker.engine.data.prompts import Prompts
from worker.engine.loop.state import RunResult, SavedState, Stop
from worker.engine.loop.steps import run_loop

PROMPTS = ["What is 1 + 1?", "Name a prime.", "Is 9 square?", "What is 2 * 5?", "Is 7 odd?"]


def make_spec(**loop: Any) -> JobSpec:
    return JobSpec.model_validate(
        {
            "backend": "trio",
            "student": {"base_model": "student/model", "lora_rank": 8},
            "teacher": {"base_model": "teacher/model"},
            "dataset": {"source": "inline", "prompts": PROMPTS, "question_suffix": "Box it."},
            "sampling": {"max_tokens": 6},
            "optim": {"learning_rate": 1e-4},
            "loop": {"batch_size": 2, "group_size": 2, **loop},
        }
    )


async def run(
    spec: JobSpec,
    fake: FakeServiceClient,
    *,
    stop_after: int | None = None,
    stop: Stop = Stop.resume,
    **kwargs: Any,
) -> tuple[RecordingSink, RunResult]:
    """Run the loop; `stop_after` n steps, `stop` is asked for at every later boundary."""
    sink = RecordingSink()
    result = await run_loop(
        spec,
        fake,
        Prompts(PROMPTS, [None] * len(PROMPTS)),
        sink,
        should_stop=lambda: (
            stop if stop_after is not None and len(sink.steps) >= stop_after else None
        ),
        **kwargs,
    )
    return sink, result


def trained(sink: RecordingSink) -> dict[int, dict[str, float]]:
    """Each step's metrics but its timings."""
    return {
        step: {
            k: v
            for k, v in metrics.items()
            if not k.startswith("time/") and k != "data/completion_tokens_per_second"
        }
        for step, metrics in sink.steps.items()
    }


def final_weights(fake: FakeServiceClient, sink: RecordingSink) -> str:
    [path] = [path for _, kind, path in sink.checkpoints if kind == "final"]
    return fake.checkpoints[path].weights


def batches(fake: FakeServiceClient) -> list[list[dict[str, Any]]]:
    return [[d.model_dump() for d in c.args["data"]] for c in fake.calls_named("forward_backward")]


def sampled_by(fake: FakeServiceClient) -> dict[tuple[int, ...], set[int]]:
    """Each sampled (prompt + completion) as a datum's model input has it, and the versions
    (optimizer steps) of the samplers that drew it."""
    versions: dict[tuple[int, ...], set[int]] = {}
    for call in fake.calls_named("sample"):
        prompt = call.args["request"].prompt.chunks[0].tokens
        for seq in call.args["response"].sequences:
            key = tuple(prompt + seq.tokens[:-1])
            versions.setdefault(key, set()).add(call.args["version"])
    return versions


@pytest.mark.parametrize("refresh", [1, 2])
async def test_on_policy_sends_the_datums_of_the_reference_loop(refresh):
    spec = make_spec(steps=5, sampler_refresh_steps=refresh)
    loop_fake, reference_fake = FakeServiceClient(), FakeServiceClient()

    sink, _ = await run(spec, loop_fake)
    _, expected = await reference_run(spec, reference_fake, PROMPTS)

    assert batches(loop_fake) == [[d.model_dump() for d in step] for step in expected]
    assert [c.args["optimizer_steps"] for c in loop_fake.calls_named("refresh_sampler")] == [
        c.args["optimizer_steps"] for c in reference_fake.calls_named("refresh_sampler")
    ]
    assert [m["train/staleness_max"] for m in sink.steps.values()] == [
        step % refresh for step in range(5)
    ]


@pytest.mark.parametrize("k", [1, 2])
async def test_each_step_trains_on_rollouts_exactly_k_versions_old_at_most(k):
    fake = FakeServiceClient()

    sink, _ = await run(make_spec(steps=6, max_steps_off_policy=k), fake)

    drawn = sampled_by(fake)
    for step, call in enumerate(fake.calls_named("forward_backward")):
        version = max(step - k, 0)
        assert {v for d in call.args["data"] for v in drawn[tuple(d.model_input.to_ints())]} == {
            version
        }, step
        assert sink.steps[step]["train/staleness_mean"] == step - version
        assert sink.steps[step]["train/staleness_max"] == step - version <= k
    # One sampler per step, made from the weights of that moment: the first k + 1 share the
    # initial weights, each later one the weights k steps back.
    refreshed = [c.args["optimizer_steps"] for c in fake.calls_named("refresh_sampler")]
    assert refreshed == [0] * (k + 1) + list(range(1, 6 - k))


async def test_the_next_step_samples_while_this_one_trains(monkeypatch):
    """forward_backward's result waits until the next step's rollouts were sampled: only a
    loop that samples ahead while a step trains can finish."""
    fake = FakeServiceClient()
    submit = FakeTrainingClient.forward_backward_async
    steps, prompts_per_step = 4, 2

    async def after_the_next_steps_sampling(self: FakeTrainingClient, *args: Any, **kw: Any):
        step = len(self.service.calls_named("forward_backward"))
        future = await submit(self, *args, **kw)

        async def result() -> Any:
            next_sampled = min(step + 2, steps) * prompts_per_step
            while len(self.service.calls_named("sample")) < next_sampled:
                await asyncio.sleep(0)
            return await future

        return result()

    monkeypatch.setattr(FakeTrainingClient, "forward_backward_async", after_the_next_steps_sampling)

    sink, _ = await asyncio.wait_for(run(make_spec(steps=steps, max_steps_off_policy=1), fake), 30)
    assert sorted(sink.steps) == [0, 1, 2, 3]
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(run(make_spec(steps=steps), FakeServiceClient()), 0.5)


async def test_a_stop_takes_effect_once_a_resumed_run_can_sample_the_same_rollouts():
    """Asked at the boundary of step 3, a k = 1 run still trains step 3 (its rollouts were
    sampling already) and keeps the weights step 4 samples from; the rollouts sampling for
    step 4 are dropped and sampled again after the resume, from those weights."""
    spec = make_spec(steps=7, max_steps_off_policy=1)
    fake = FakeServiceClient()
    whole, _ = await run(spec, fake)
    calls_before = len(fake.calls)

    stopped, result = await run(spec, fake, stop_after=3)
    stopped_calls = fake.calls[calls_before:]
    resumed, _ = await run(spec, fake, resume=result.state)

    assert result.stopped and result.steps_done == 4 and sorted(stopped.steps) == [0, 1, 2, 3]
    assert result.state is not None
    [(step, _, kept)] = [c for c in stopped.checkpoints if c[1] == "sampler"]
    assert (step, result.state.samplers) == (3, {3: kept})
    assert [c.args["optimizer_steps"] for c in stopped_calls if c.name == "save_weights"] == [3]
    # Step 4's rollouts were sampling when the run stopped; nothing trained on them.
    assert sum(c.name == "sample" for c in stopped_calls) == 5 * 2
    assert sum(c.name == "optim_step" for c in stopped_calls) == 4
    assert trained(resumed) == {s: m for s, m in trained(whole).items() if s >= 4}
    assert final_weights(fake, resumed) == final_weights(fake, whole)
    loaded = [c.args["model_path"] for c in fake.calls_named("create_sampling_client")]
    assert kept in loaded


@pytest.mark.parametrize("stop_after", [3, 7])
async def test_a_cancel_stops_at_the_next_boundary_without_sampler_weights(stop_after):
    """Where a stop to resume would train on and keep sampler weights (asked at step 3),
    or finish and save the final weights (asked during the last step), a cancel ends the
    run at the next boundary: nothing more trained, its state saved there (another job may
    continue from it), no sampler weights."""
    spec = make_spec(steps=7, max_steps_off_policy=1)
    fake = FakeServiceClient()

    sink, result = await run(spec, fake, stop_after=stop_after, stop=Stop.cancel)

    [saved] = [call.args["path"] for call in fake.calls_named("save_state")]
    assert result == RunResult(stop_after, stopped=True, state=SavedState(saved, stop_after))
    assert sorted(sink.steps) == list(range(stop_after))
    assert sink.checkpoints == [(stop_after, "state", saved)]
    assert len(fake.calls_named("optim_step")) == stop_after
    assert not fake.calls_named("save_weights")


async def test_a_stop_right_after_a_scheduled_save_takes_effect_at_once():
    spec = make_spec(steps=6, max_steps_off_policy=1, save_every=2)
    fake = FakeServiceClient()

    sink, result = await run(spec, fake, stop_after=2)

    assert result.steps_done == 2 and result.state is not None
    saved = dict(((s, kind), path) for s, kind, path in sink.checkpoints)
    assert result.state == SavedState(saved[2, "state"], 2, {1: saved[1, "sampler"]})
    assert len(fake.calls_named("save_state")) == 1, "the scheduled state is reused"


@pytest.mark.parametrize("k", [1, 2])
async def test_a_crashed_run_resumes_from_its_last_saved_state_exactly(k):
    """After a crash a run resumes from the last scheduled state, with the sampler weights
    the loop kept for it when they were made (recorded as sampler checkpoints)."""
    spec = make_spec(steps=8, max_steps_off_policy=k, save_every=3)
    fake = FakeServiceClient()
    whole, _ = await run(spec, fake)
    saved = {(s, kind): path for s, kind, path in whole.checkpoints}
    samplers = {s: path for (s, kind), path in saved.items() if kind == "sampler"}
    assert set(samplers) == {1, 2, 3, 4, 5, 6} - ({1, 4} if k == 1 else set())

    resumed, _ = await run(spec, fake, resume=SavedState(saved[6, "state"], 6, samplers))

    assert trained(resumed) == {s: m for s, m in trained(whole).items() if s >= 6}
    assert final_weights(fake, resumed) == final_weights(fake, whole)


async def test_resuming_without_the_sampler_weights_it_needs_is_refused():
    spec = make_spec(steps=8, max_steps_off_policy=2, save_every=3)
    fake = FakeServiceClient()
    whole, _ = await run(spec, fake)
    [state] = [path for s, kind, path in whole.checkpoints if (s, kind) == (6, "state")]
    samples = len(fake.calls_named("sample"))

    with pytest.raises(OPDError, match=r"saved after steps \[4, 5\]") as refused:
        await run(spec, fake, resume=SavedState(state, 6))
    assert refused.value.code == "bad_resume_state"
    assert len(fake.calls_named("sample")) == samples
