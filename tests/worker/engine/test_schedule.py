"""The pipeline's schedule (pure) and its lane: which weights sample which step, what a
resume needs, and batches that never overlap."""

from __future__ import annotations

import asyncio

import pytest

from kernel.spec import LoopSpec, SpecError, parse_spec
from worker.engine.pipeline import Lane
from worker.engine.schedule import (
    kept_for_a_save,
    last_step_sampled_by,
    resume_versions,
    sampler_version,
    step_seed,
)


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
        parse_spec({"loop": {"max_steps_off_policy": 1, "sampler_refresh_steps": 2}})
    with pytest.raises(SpecError, match="max_steps_off_policy"):
        parse_spec({"loop": {"max_steps_off_policy": 9}})
    assert parse_spec({}).loop.max_steps_off_policy == 0


async def test_the_lane_runs_one_job_at_a_time_in_queue_order():
    lane = Lane()
    log: list[str] = []

    async def job(name: str) -> str:
        log.append(f"{name} starts")
        await asyncio.sleep(0)
        log.append(f"{name} ends")
        return name

    tasks = [lane.queue(lambda name=name: job(name)) for name in "abc"]
    assert await tasks[2] == "c"
    assert log == ["a starts", "a ends", "b starts", "b ends", "c starts", "c ends"]


async def test_a_failed_job_does_not_stop_the_lane_and_close_drops_what_is_queued():
    lane = Lane()
    started: list[int] = []
    running = asyncio.Event()

    async def fail() -> None:
        raise RuntimeError("boom")

    async def wait(n: int) -> None:
        started.append(n)
        running.set()
        await asyncio.Event().wait()

    failed = lane.queue(fail)
    blocked = lane.queue(lambda: wait(1))
    queued = lane.queue(lambda: wait(2))
    with pytest.raises(RuntimeError, match="boom"):
        await failed
    await running.wait()
    await lane.close()
    assert started == [1] and blocked.cancelled() and queued.cancelled()
    assert not lane.pending
