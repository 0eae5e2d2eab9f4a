"""How many rollouts a job keeps: each step's while the job's total fits, else evenly spread."""

from __future__ import annotations

from kernel.samples import MAX_SAMPLES_PER_JOB, keeps_samples


def kept_steps(total_steps: int, per_step: int) -> list[int]:
    return [s for s in range(total_steps) if keeps_samples(s, total_steps, per_step)]


def test_short_jobs_keep_every_step_and_long_ones_stay_within_the_bound():
    assert kept_steps(60, 2) == list(range(60))
    assert kept_steps(60, 0) == []
    for total, per_step in ((100_000, 2), (5_000, 16), (1_001, 2)):
        steps = kept_steps(total, per_step)
        assert len(steps) * per_step <= MAX_SAMPLES_PER_JOB
        assert len(steps) * per_step > MAX_SAMPLES_PER_JOB / 2, "spread over the whole run"
        assert steps[0] == 0 and steps[-1] > total * 0.9
