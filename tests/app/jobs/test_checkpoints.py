"""What a missing checkpoint's message says about the steps a job did save: all of them
when there are few, else the first and last few and how many, however many there are."""

from __future__ import annotations

import pytest

from app.jobs.checkpoints import CheckpointUnavailable, sampler_weights, training_state
from app.jobs.schemas import CheckpointKind
from app.jobs.tables import Checkpoint, Job


async def save(session, job: Job, kind: CheckpointKind, steps: range) -> None:
    session.add_all(
        Checkpoint(job_id=job.id, step=step, kind=kind, path=f"/saved/{kind}-{step}")
        for step in steps
    )
    await session.commit()


async def refusal(session, job: Job, step: int) -> str:
    with pytest.raises(CheckpointUnavailable) as refused:
        await training_state(session, job, step)
    return str(refused.value)


async def test_a_job_with_many_states_names_the_first_and_last_few_and_how_many(session, job):
    await save(session, job, CheckpointKind.state, range(1, 1001))
    await save(session, job, CheckpointKind.state, range(998, 1001))  # replayed after a crash
    await save(session, job, CheckpointKind.sampler, range(2000, 3000))
    message = await refusal(session, job, 5000)
    assert message.endswith(
        "saved no training state after step 5000; it saved states after steps: "
        "1, 2, 3, ..., 998, 999, 1000 (1,000 in all)"
    ), message


async def test_a_job_with_few_steps_names_each_once(session, job):
    assert (await refusal(session, job, 7)).endswith("states after steps: none yet")
    await save(session, job, CheckpointKind.sampler, range(2, 12, 2))
    await save(session, job, CheckpointKind.final, range(12, 13))
    await save(session, job, CheckpointKind.sampler, range(4, 5))
    with pytest.raises(CheckpointUnavailable) as refused:
        await sampler_weights(session, job, 7)
    assert str(refused.value).endswith("sampler weights after steps: 2, 4, 6, 8, 10, 12")
