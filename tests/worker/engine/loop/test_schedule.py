"""The pipeline's schedule (pure): which weights sample which step, what a resume needs;
and the teacher's turns: batches in flight at once never interleave their scoring."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pytrio.types import ModelInput, SamplingParams

from kernel.spec import LoopSpec, SpecError, parse_spec
from tests.fakes.trio import FakeServiceClient
from tests.support import named
from worker.engine.loop.schedule import (
    kept_for_a_save,
    last_step_sampled_by,
    resume_versions,
    sampler_version,
    step_seed,
)
from worker.engine.rollouts.sampling import sample_and_score
from worker.engine.teachers.scoring import Prompted


def loop(**fields: int) -> LoopSpec:
    return LoopSpec.model_validate({"steps": 10, **fields})


def test_on_policy_samples_each_step_from_its_refresh_blocks_weights():
    assert [sampler_version(t, loop()) for t in range(4)] == [0, 1, 2, 3]
    refresh = loop(sampler_refresh_steps=3)
    assert [sampler_version(t, refresh) for t in range(7)] == [0, 0, 0, 3, 3, 3, 6]
    assert [last_step_sampled_by(t, refresh) for t in range(3)] == [0, 1, 2]


@pytest.mark.parametrize("k", [1, 2, 3])
def test_k_steps_off_policy_samples_from_the_weights_k_steps_back(k):
    spec = loop(max_steps_off_policy=k)
    versions = [sampler_version(t, spec) for t in range(10)]
    assert versions == [max(t - k, 0) for t in range(10)]
    assert all(0 <= t - v <= k for t, v in enumerate(versions)), "staleness is at most k"
    # A step's rollouts start sampling at the boundary its weights are made at, k ahead,
    # and never past the last step.
    assert [last_step_sampled_by(t, spec) for t in (0, 5, 9)] == [k, 5 + k, 9]
    assert all(last_step_sampled_by(v, spec) >= t for t, v in enumerate(versions))


def test_a_resume_needs_the_older_weights_its_next_steps_sample_from():
    k2 = loop(max_steps_off_policy=2)
    assert resume_versions(0, k2) == set()
    assert resume_versions(1, k2) == {0}  # steps 1 and 2 sample from the first weights
    assert resume_versions(5, k2) == {3, 4}
    assert resume_versions(9, k2) == {7}  # step 9 is the last
    assert resume_versions(10, k2) == set()
    refresh = loop(sampler_refresh_steps=3)
    assert [resume_versions(t, refresh) for t in (3, 4, 5)] == [set(), {3}, {3}]
    assert all(resume_versions(t, loop()) == set() for t in range(11))


def test_weights_a_scheduled_save_resumes_from_are_kept_when_made():
    k1 = loop(max_steps_off_policy=1, save_every=3)
    assert [v for v in range(10) if kept_for_a_save(v, k1)] == [2, 5, 8]
    k2 = loop(max_steps_off_policy=2, save_every=4)
    assert [v for v in range(10) if kept_for_a_save(v, k2)] == [2, 3, 6, 7]
    assert not any(kept_for_a_save(v, loop(save_every=3)) for v in range(10)), "k = 0"
    assert not any(kept_for_a_save(v, loop(max_steps_off_policy=1)) for v in range(10))


def test_each_step_samples_with_a_seed_of_its_own():
    seeds = [step_seed(42, t) for t in range(100)]
    assert len(set(seeds)) == 100 and seeds == [step_seed(42, t) for t in range(100)]
    assert all(0 <= s < 2**31 for s in seeds) and step_seed(43, 0) != seeds[0]
    assert step_seed(None, 3) is None


def test_off_policy_needs_a_refresh_every_step():
    with pytest.raises(SpecError, match="sampler_refresh_steps: 1"):
        parse_spec(named({"loop": {"max_steps_off_policy": 1, "sampler_refresh_steps": 2}}))
    with pytest.raises(SpecError, match="max_steps_off_policy"):
        parse_spec(named({"loop": {"max_steps_off_policy": 9}}))
    assert parse_spec(named({})).loop.max_steps_off_policy == 0


def batch_of(tokens: tuple[int, ...]) -> str:
    """The batch of `score_two_batches_at_once` a sequence belongs to, by its prompt."""
    return "first" if tokens[0] in (1, 4) else "second"


class SlowTeacher:
    """The fake teacher, each call taking a moment: calls of batches in flight at once
    could overlap."""

    def __init__(self, teacher: Any) -> None:
        self.teacher = teacher
        self.in_progress: list[tuple[int, ...]] = []
        self.overlaps = 0
        self.scored: list[tuple[int, ...]] = []

    async def compute_logprobs_async(self, prompt: ModelInput) -> list[float | None]:
        tokens = tuple(prompt.to_ints())
        self.overlaps += any(batch_of(other) != batch_of(tokens) for other in self.in_progress)
        self.in_progress.append(tokens)
        await asyncio.sleep(0)
        self.in_progress.remove(tokens)
        self.scored.append(tokens)
        return await self.teacher.compute_logprobs_async(prompt)


def scorers(teacher: SlowTeacher, prompts: list[list[int]]) -> list[Prompted]:
    return [Prompted("teacher", teacher, prompt) for prompt in prompts]  # type: ignore[arg-type]


async def score_two_batches_at_once(scoring: asyncio.Lock | None) -> SlowTeacher:
    fake = FakeServiceClient()
    training = await fake.create_lora_training_client_async("student/model", rank=8)
    teacher = SlowTeacher(await fake.create_sampling_client_async("teacher/model"))
    params = SamplingParams(max_tokens=4, seed=1)
    batches = [[[1, 2, 3], [4, 5, 6]], [[7, 8, 9], [10, 11, 12]]]
    samplers = [await training.save_weights_and_get_sampling_client_async() for _ in batches]
    await asyncio.gather(
        *(
            sample_and_score(sampler, scorers(teacher, batch), batch, 2, params, scoring=scoring)
            for sampler, batch in zip(samplers, batches, strict=True)
        )
    )
    return teacher


async def test_batches_in_flight_take_turns_at_the_teacher():
    """Each batch's completions are scored together, and no other batch's meanwhile."""
    taking_turns = await score_two_batches_at_once(asyncio.Lock())
    assert len(taking_turns.scored) == 8 and taking_turns.overlaps == 0
    prompts = [tokens[:3] for tokens in taking_turns.scored]
    assert prompts[:4] in ([(1, 2, 3)] * 2 + [(4, 5, 6)] * 2, [(7, 8, 9)] * 2 + [(10, 11, 12)] * 2)
    assert (await score_two_batches_at_once(None)).overlaps > 0, "what the turns prevent"
