"""The controller's decisions on a real database: trials up to `parallel`, reproducible
draws, one controller per sweep (the lease), racing controllers that double nothing, the
team's queued limit, and the end of a sweep once its last trial ended."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import func, select, update

from app.models import (
    EarlyStop,
    Job,
    JobStatus,
    StepMetric,
    Sweep,
    SweepCreate,
    SweepStatus,
    Team,
    utcnow,
)
from app.store.jobs import claim_job, complete_job
from app.store.limits import Limits
from app.store.rows import get_job
from app.store.sweep_control import Pass, add_trials, advance, claim_sweeps
from app.store.sweeps import create_sweep, get_sweep, read_state, trials_of
from tests.app.conftest import small_spec

OWNER = "controller-a"


def random_sweep(seed: int = 3, parallel: int = 3, max_trials: int = 5) -> SweepCreate:
    return SweepCreate.model_validate(
        {
            "name": "draws",
            "base": small_spec(),
            "parameters": {
                "optim.learning_rate": {"min": 1e-4, "max": 1e-2, "distribution": "log_uniform"},
                "loop.loss_fn": {"values": ["importance_sampling", "ppo", "cispo"]},
            },
            "method": "random",
            "metric": {"name": "opd/reverse_kl_mean", "goal": "minimize"},
            "max_trials": max_trials,
            "parallel": parallel,
            "seed": seed,
        }
    )


async def step(session, sweep_id: int, owner: str = OWNER, limits: Limits | None = None) -> Pass:
    assert sweep_id in await claim_sweeps(session, owner, 60)
    return await advance(session, sweep_id, owner, limits or Limits())


async def tried(session, sweep_id: int) -> list[tuple[int | None, float, str]]:
    return [
        (job.sweep_trial, job.spec["optim"]["learning_rate"], job.spec["loop"]["loss_fn"])
        for job in await trials_of(session, sweep_id)
    ]


async def finish(session, job_ids: list[int]) -> None:
    await session.execute(
        update(Job)
        .where(Job.id.in_(job_ids))
        .values(status=JobStatus.succeeded, finished_at=utcnow())
    )
    await session.commit()


async def test_trials_fill_parallel_and_the_same_seed_draws_the_same(session, key):
    first = await create_sweep(session, key.team.id, random_sweep())
    same = await create_sweep(session, key.team.id, random_sweep())
    other = await create_sweep(session, key.team.id, random_sweep(seed=4))

    created = (await step(session, first.id)).created
    assert len(created) == 3
    assert (await step(session, first.id)).created == []  # three unfinished: parallel
    await finish(session, created[:2])
    assert len((await step(session, first.id)).created) == 2  # the last two of five
    await step(session, same.id)
    await finish(session, [job.id for job in await trials_of(session, same.id)])
    await step(session, same.id)
    await step(session, other.id)

    draws = await tried(session, first.id)
    assert [number for number, _, _ in draws] == [1, 2, 3, 4, 5]
    assert draws == await tried(session, same.id)
    assert draws[:3] != await tried(session, other.id)


async def test_one_controller_holds_a_sweep_until_its_lease_runs_out(session, key):
    sweep = await create_sweep(session, key.team.id, random_sweep())
    assert sweep.id in await claim_sweeps(session, OWNER, 60)
    assert sweep.id not in await claim_sweeps(session, "controller-b", 60)
    assert (await advance(session, sweep.id, "controller-b", Limits())).created == []

    await session.execute(
        update(Sweep)
        .where(Sweep.id == sweep.id)
        .values(lease_until=utcnow() - timedelta(seconds=1))
    )
    await session.commit()
    assert sweep.id in await claim_sweeps(session, "controller-b", 60)
    assert len((await advance(session, sweep.id, "controller-b", Limits())).created) == 3
    assert (await advance(session, sweep.id, OWNER, Limits())).created == []  # lost the lease


async def test_racing_controllers_double_no_trial(sessions, key):
    """Two controllers that read the sweep at the same moment (a lease that ran out under a
    slow one): the second's inserts find the trial numbers taken and stop."""
    async with sessions() as one, sessions() as two:
        sweep = await create_sweep(one, key.team.id, random_sweep())
        stale = await read_state(two, await get_sweep(two, sweep.id))
        first, second = Pass(), Pass()
        await add_trials(
            one, await read_state(one, await get_sweep(one, sweep.id)), Limits(), first
        )
        await add_trials(two, stale, Limits(), second)

        assert len(first.created) == 3
        assert second.created == []
        count = select(func.count()).where(Job.sweep_id == sweep.id)
        assert (await one.execute(count)).scalar_one() == 3


async def test_trials_wait_for_room_under_the_teams_queued_limit(session, key):
    sweep = await create_sweep(session, key.team.id, random_sweep())
    limits = Limits(max_queued=1)
    assert len((await step(session, sweep.id, limits=limits)).created) == 1
    assert (await step(session, sweep.id, limits=limits)).created == []
    await session.execute(update(Team).where(Team.id == key.team.id).values(max_queued=2))
    await session.commit()
    assert len((await step(session, sweep.id, limits=limits)).created) == 1


async def test_the_sweep_completes_once_its_last_trial_ended(session, key):
    sweep = await create_sweep(session, key.team.id, random_sweep(parallel=2, max_trials=2))
    created = (await step(session, sweep.id)).created
    assert (await step(session, sweep.id)).ended is None
    await finish(session, created)
    assert (await step(session, sweep.id)).ended is SweepStatus.completed
    ended = await get_sweep(session, sweep.id)
    assert (ended.status, ended.lease_owner) == (SweepStatus.completed, None)
    assert sweep.id not in await claim_sweeps(session, OWNER, 60)


async def test_a_trial_that_lost_at_a_rung_is_asked_to_stop_once(session, key):
    definition = random_sweep(parallel=2, max_trials=2).model_copy(
        update={"early_stop": EarlyStop(type="asha", min_steps=1, eta=2)}
    )
    sweep = await create_sweep(session, key.team.id, definition)
    leader, loser = (await step(session, sweep.id)).created
    for job_id, value in ((leader, 1.0), (loser, 2.0)):
        assert await claim_job(session, job_id, "w", heartbeat_timeout=60) is not None
        for at in (0, 1):
            session.add(StepMetric(job_id=job_id, step=at, metrics={"opd/reverse_kl_mean": value}))
    await session.commit()

    assert (await step(session, sweep.id)).stopped == [loser]
    assert (await step(session, sweep.id)).stopped == []  # already stopping
    stopping = await get_job(session, loser)
    assert (stopping.status, stopping.stop_reason) == (JobStatus.cancelling, "early_stopped")
    assert (await get_job(session, leader)).status == JobStatus.running
    finished = await complete_job(session, loser, "w", "weights")  # it ended first
    assert (finished.status, finished.stop_reason) == (JobStatus.succeeded, None)
