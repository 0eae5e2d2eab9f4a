"""The controller's decisions on a real database: trials up to `parallel`, reproducible
draws, one controller per sweep (the lease), racing controllers that double nothing, the
team's queued limit, the end of a sweep once its last trial ended; each trial admitted as
any job is, and none inserted once its sweep was cancelled."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import func, select, update
from sqlalchemy.exc import DBAPIError

from app.auth.tables import Team
from app.core.tables import utcnow
from app.jobs.limits import Limits
from app.jobs.rows import get_job
from app.jobs.schemas import JobStatus
from app.jobs.store import claim_job, complete_job, create_job
from app.jobs.tables import Job
from app.records.store import record_checkpoint, record_step
from app.sweeps.control import (
    Pass,
    add_trials,
    advance,
    cancel_stray_trials,
    claim_sweeps,
    held,
    judge_rungs,
)
from app.sweeps.schemas import EarlyStop, SweepCreate, SweepMetric, SweepStatus
from app.sweeps.service import cancel_sweep
from app.sweeps.store import create_sweep, end_sweep, get_sweep, read_state, trials_of
from app.sweeps.tables import Sweep, SweepRung
from kernel.spec import JobSpec
from tests.app.conftest import small_spec
from tests.app.sweeps.test_store import statements

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
    first, _ = await create_sweep(session, key.team.id, random_sweep())
    same, _ = await create_sweep(session, key.team.id, random_sweep())
    other, _ = await create_sweep(session, key.team.id, random_sweep(seed=4))

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
    sweep, _ = await create_sweep(session, key.team.id, random_sweep())
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
        sweep, _ = await create_sweep(one, key.team.id, random_sweep())
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
    sweep, _ = await create_sweep(session, key.team.id, random_sweep())
    limits = Limits(max_queued=1)
    assert len((await step(session, sweep.id, limits=limits)).created) == 1
    assert (await step(session, sweep.id, limits=limits)).created == []
    await session.execute(update(Team).where(Team.id == key.team.id).values(max_queued=2))
    await session.commit()
    assert len((await step(session, sweep.id, limits=limits)).created) == 1


async def test_the_sweep_completes_once_its_last_trial_ended(session, key):
    sweep, _ = await create_sweep(session, key.team.id, random_sweep(parallel=2, max_trials=2))
    created = (await step(session, sweep.id)).created
    assert (await step(session, sweep.id)).ended is None
    await finish(session, created)
    assert (await step(session, sweep.id)).ended is SweepStatus.completed
    ended = await get_sweep(session, sweep.id)
    assert (ended.status, ended.lease_owner) == (SweepStatus.completed, None)
    assert sweep.id not in await claim_sweeps(session, OWNER, 60)


async def record(session, job_id: int, steps: range, values: dict[str, float]) -> None:
    """Steps recorded as the job's worker would (rows, summaries, summary points)."""
    for at in steps:
        await record_step(session, job_id, "w", at, values)


async def running_trials(session, sweep_id: int, values: list[float]) -> list[int]:
    """Claim the sweep's trials (as a worker) and record step 0 for each."""
    job_ids = (await step(session, sweep_id)).created
    for job_id, value in zip(job_ids, values, strict=True):
        assert await claim_job(session, job_id, "w", heartbeat_timeout=60) is not None
        await record(session, job_id, range(1), {"opd/reverse_kl_mean": value})
    return job_ids


async def test_a_trial_that_lost_at_a_rung_is_asked_to_stop_once(session, key):
    definition = random_sweep(parallel=2, max_trials=2).model_copy(
        update={"early_stop": EarlyStop(type="asha", min_steps=1, eta=2)}
    )
    sweep, _ = await create_sweep(session, key.team.id, definition)
    leader, loser = await running_trials(session, sweep.id, [1.0, 2.0])
    assert (await step(session, sweep.id)).stopped == []  # step 1 not recorded yet
    for job_id, value in ((leader, 1.0), (loser, 2.0)):
        await record(session, job_id, range(1, 2), {"opd/reverse_kl_mean": value})

    assert (await step(session, sweep.id)).stopped == [loser]
    assert (await step(session, sweep.id)).stopped == []  # already stopping
    stopping = await get_job(session, loser)
    assert (stopping.status, stopping.stop_reason) == (JobStatus.cancelling, "early_stopped")
    assert (await get_job(session, leader)).status == JobStatus.running
    finished = await complete_job(session, loser, "w", "weights")  # it ended first
    assert (finished.status, finished.stop_reason) == (JobStatus.succeeded, None)


async def trained_weights(session, team_id: int, root: str) -> Job:
    """A succeeded trio job of team `team_id` that saved its final weights at `root`/final."""
    spec = JobSpec.model_validate(small_spec(backend="trio"))
    job = (await create_job(session, team_id, spec)).job
    await claim_job(session, job.id, "w", heartbeat_timeout=60)
    await record_checkpoint(session, job.id, "w", 3, "final", f"{root}/final")
    return await complete_job(session, job.id, "w", f"{root}/final")


def stored_grid(parameters: dict[str, Any], parallel: int = 1) -> SweepCreate:
    """A trio grid sweep as stored, past the creation checks (as one stored before a check
    existed would be)."""
    return SweepCreate.model_validate(
        {
            "name": "stored",
            "base": small_spec(backend="trio", teacher={"base_model": "Qwen/Qwen3.5-4B"}),
            "parameters": {path: {"values": values} for path, values in parameters.items()},
            "method": "grid",
            "metric": {"name": "opd/reverse_kl_mean", "goal": "minimize"},
            "max_trials": 4,
            "parallel": parallel,
        }
    )


ACCURACY = "eval/accuracy"


def asha_at_10(trials: int) -> SweepCreate:
    """The issue's sweep: trials of 30 steps, ASHA from step 10 with eta 3, judged on a
    held-out accuracy (maximize), so rung 10 is the only rung."""
    return random_sweep(parallel=trials, max_trials=trials).model_copy(
        update={
            "base": small_spec(loop={"steps": 30}),
            "metric": SweepMetric(name=ACCURACY, goal="maximize"),
            "early_stop": EarlyStop(type="asha", min_steps=10, eta=3),
        }
    )


async def test_a_trial_admission_refuses_ends_failed_and_the_sweep_goes_on(session, key, make_key):
    """Each trial passes the same admission as any job: a value naming another team's
    weights makes a `failed` trial with the reason (queued for nothing), the next value a
    queued trial, and once every trial ended the sweep completes."""
    other = await make_key()
    theirs = await trained_weights(session, other.team.id, "trio://fake/theirs")
    ours = f"trio://fake/{key.team.name}/final"  # no other test's team records it
    loaded, _ = await create_sweep(
        session, key.team.id, stored_grid({"teacher.init_from.path": [theirs.final_weights_path]})
    )
    mixed, _ = await create_sweep(
        session,
        key.team.id,
        stored_grid(
            {"teacher.model_path": [theirs.final_weights_path, ours]},
            parallel=2,
        ),
    )

    refused = await step(session, loaded.id)
    assert (refused.created, len(refused.refused)) == ([], 1)
    trial = await get_job(session, refused.refused[0])
    assert (trial.status, trial.error_code) == (JobStatus.failed, "spec_refused")
    assert trial.error_message.startswith("teacher.init_from.path: is filled by the service")
    assert trial.started_at is None and trial.worker_id is None
    assert (await step(session, loaded.id)).ended is SweepStatus.completed

    both = await step(session, mixed.id)
    assert (len(both.refused), len(both.created)) == (1, 1)
    failed, queued = await trials_of(session, mixed.id)
    assert (failed.status, failed.error_code) == (JobStatus.failed, "spec_refused")
    assert failed.error_message.startswith("teacher.model_path: not weights this team may load")
    assert (queued.status, queued.spec["teacher"]["model_path"]) == (
        JobStatus.queued,
        ours,
    )


async def test_a_trial_of_init_from_job_gets_its_path_from_the_teams_job(session, key):
    ours = await trained_weights(session, key.team.id, "trio://fake/ours")
    definition = stored_grid({"loop.loss_fn": ["importance_sampling"]})
    assert definition.base is not None
    definition.base["teacher"] = {"base_model": "Qwen/Qwen3.5-4B", "init_from": {"job": ours.id}}
    sweep, _ = await create_sweep(session, key.team.id, definition)
    (created,) = (await step(session, sweep.id)).created
    init_from = (await get_job(session, created)).spec["teacher"]["init_from"]
    assert init_from["path"] == "trio://fake/ours/final"


async def test_a_cancel_between_the_controllers_read_and_its_insert_starts_nothing(sessions, key):
    """The controller read the sweep running, then the sweep was cancelled, then it would
    insert: the insert's transaction sees the sweep ended, and no trial exists."""
    async with sessions() as controller, sessions() as api:
        sweep, _ = await create_sweep(controller, key.team.id, random_sweep())
        assert sweep.id in await claim_sweeps(controller, OWNER, 60)
        read = await read_state(controller, await get_sweep(controller, sweep.id))

        await cancel_sweep(api, sweep.id, key.team.id)
        done = Pass()
        await add_trials(controller, read, Limits(), done)

        assert done.created == done.refused == []
        assert await trials_of(controller, sweep.id) == []


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)  # SQLite: one writer
async def test_a_trial_is_inserted_under_a_lock_of_its_sweeps_row(sessions, key):
    """Postgres: while the insert's transaction is open the sweep row is locked, so a
    cancel's update of it waits until the trial is there for the cancel to see."""
    async with sessions() as controller, sessions() as api:
        sweep, _ = await create_sweep(controller, key.team.id, random_sweep())
        assert await held(controller, await get_sweep(controller, sweep.id))
        locked = select(Sweep.id).where(Sweep.id == sweep.id).with_for_update(nowait=True)
        with pytest.raises(DBAPIError, match="could not obtain lock"):
            await api.execute(locked)
        await controller.rollback()
        await api.rollback()
        assert (await api.execute(locked)).scalar_one() == sweep.id


async def test_the_controller_cancels_unfinished_trials_of_an_ended_sweep(session, key):
    sweep, _ = await create_sweep(session, key.team.id, random_sweep(parallel=2))
    created = (await step(session, sweep.id)).created
    await finish(session, created[:1])
    assert await end_sweep(session, await get_sweep(session, sweep.id), SweepStatus.cancelled)

    assert await cancel_stray_trials(session) == created[1:]
    assert [job.status for job in await trials_of(session, sweep.id)] == [
        JobStatus.succeeded,
        JobStatus.cancelled,
    ]
    assert await cancel_stray_trials(session) == []


async def accuracy_until(session, job_id: int, last: int, accuracy: float) -> None:
    """Steps up to `last`, an eval every 5 steps (so the value at rung 10 is the eval at
    step 10), the training metric at every step."""
    done = (await get_job(session, job_id)).steps_done
    for at in range(done, last + 1):
        values = {"opd/reverse_kl_mean": 1.0} | ({ACCURACY: accuracy} if at % 5 == 0 else {})
        await record_step(session, job_id, "w", at, values)


async def judgments(session, sweep_id: int) -> dict[int, tuple[int, float | None, bool, int]]:
    rows = await session.execute(select(SweepRung).where(SweepRung.sweep_id == sweep_id))
    return {r.job_id: (r.rung, r.value, r.kept, r.competing) for r in rows.scalars()}


async def test_a_trial_is_judged_once_at_its_rung_against_the_trials_there_before(session, key):
    """Issue 25's run: trial 3 reached rung 10 as the best so far and continued; trial 4,
    better, reached it when trial 3 was at step 27. Trial 3 is not judged again: it runs
    to its end. Each judgment is stored with the trials it was made against."""
    sweep, _ = await create_sweep(session, key.team.id, asha_at_10(4))
    t1, t2, t3, t4 = await accuracy_trials(session, sweep.id)

    await accuracy_until(session, t1, 12, 0.3)
    assert (await step(session, sweep.id)).stopped == []  # alone at 10: the best so far
    await accuracy_until(session, t2, 10, 0.2)
    assert (await step(session, sweep.id)).stopped == [t2]  # 2 there: only the best goes on
    await accuracy_until(session, t3, 11, 0.4)
    assert (await step(session, sweep.id)).stopped == []  # the best of 3
    await accuracy_until(session, t3, 27, 0.4)
    await accuracy_until(session, t4, 10, 0.5)
    assert (await step(session, sweep.id)).stopped == []  # t4 the best of 4; t3 stays

    assert [(await get_job(session, t)).status for t in (t1, t2, t3, t4)] == [
        JobStatus.running,
        JobStatus.cancelling,
        JobStatus.running,
        JobStatus.running,
    ]
    assert await judgments(session, sweep.id) == {
        t1: (10, 0.3, True, 1),
        t2: (10, 0.2, False, 2),
        t3: (10, 0.4, True, 3),
        t4: (10, 0.5, True, 4),
    }


async def accuracy_trials(session, sweep_id: int) -> list[int]:
    job_ids = (await step(session, sweep_id)).created
    for job_id in job_ids:
        assert await claim_job(session, job_id, "w", heartbeat_timeout=60) is not None
    return job_ids


async def test_a_restarted_controller_stops_what_the_stored_judgment_says(sessions, key):
    """A controller judged trial 2 a loser at rung 10 and died before stopping it; by the
    time its successor takes the sweep, four worse trials reached the rung, among which
    trial 2 would now be second of six (kept). The successor stops it as judged, and judges
    only the newcomers."""
    async with sessions() as session:
        sweep, _ = await create_sweep(session, key.team.id, asha_at_10(6))
        trials = await accuracy_trials(session, sweep.id)
        for job_id, accuracy in zip(trials[:2], (0.3, 0.2), strict=True):
            await accuracy_until(session, job_id, 10, accuracy)
        state = await read_state(session, await get_sweep(session, sweep.id))
        assert definition_rule(state) is not None
        await judge_rungs(session, state, definition_rule(state), None)  # then it died
        for job_id, accuracy in zip(trials[2:], (0.1, 0.05, 0.0, 0.01), strict=True):
            await accuracy_until(session, job_id, 10, accuracy)
        await expire_lease(session, sweep.id)

    async with sessions() as successor:
        assert sweep.id in await claim_sweeps(successor, "controller-b", 60)
        done = await advance(successor, sweep.id, "controller-b", Limits())
        assert done.stopped == trials[1:]
        judged = await judgments(successor, sweep.id)
        assert judged[trials[1]] == (10, 0.2, False, 2)
        assert [judged[t][2:] for t in trials[2:]] == [(False, 6)] * 4  # judged together
        assert (await advance(successor, sweep.id, "controller-b", Limits())).stopped == []
        assert await judgments(successor, sweep.id) == judged


def definition_rule(state) -> EarlyStop | None:
    return state.definition.early_stop


async def expire_lease(session, sweep_id: int) -> None:
    await session.execute(
        update(Sweep)
        .where(Sweep.id == sweep_id)
        .values(lease_until=utcnow() - timedelta(seconds=1))
    )
    await session.commit()


def asha_every_power_of_two() -> SweepCreate:
    """Two trials of 40 steps, ASHA at steps 4, 8, 16 and 32 (eta 2)."""
    return random_sweep(parallel=2, max_trials=2).model_copy(
        update={
            "base": small_spec(loop={"steps": 40}),
            "early_stop": EarlyStop(type="asha", min_steps=4, eta=2),
        }
    )


async def trials_at_step_20(session, sweep_id: int) -> list[int]:
    job_ids = await running_trials(session, sweep_id, [1.0, 1.0])
    for job_id in job_ids:
        await record(session, job_id, range(1, 21), {"opd/reverse_kl_mean": 1.0})
    return job_ids


async def test_a_pass_reads_the_points_at_newly_reached_rungs_only(sessions, session, key):
    """Caught up at rungs 4, 8 and 16 at once, a pass reads one block of step rows per rung
    (not the curves); the next pass, with no trial at a new rung, reads no metric at all."""
    sweep, _ = await create_sweep(session, key.team.id, asha_every_power_of_two())
    await trials_at_step_20(session, sweep.id)

    with statements(sessions) as first:
        await step(session, sweep.id)
    reads = [s for s in first if "step_metrics" in s or "metric_summaries" in s]
    assert len(reads) == 3 and all("BETWEEN" in s for s in reads), reads
    assert sorted({r[0] for r in (await judgments_by_rung(session, sweep.id))}) == [4, 8, 16]
    with statements(sessions) as second:
        await step(session, sweep.id)
    assert not [s for s in second if "step_metrics" in s or "metric_summaries" in s]


async def test_a_pass_past_its_deadline_takes_up_no_further_rung(session, key):
    """With its time spent after the first rung, each pass judges one rung; the next pass
    carries on from the stored judgments."""
    sweep, _ = await create_sweep(session, key.team.id, asha_every_power_of_two())
    await trials_at_step_20(session, sweep.id)
    for judged in ([4], [4, 8], [4, 8, 16], [4, 8, 16]):
        assert sweep.id in await claim_sweeps(session, OWNER, 60)
        await advance(session, sweep.id, OWNER, Limits(), deadline=0.0)
        assert sorted({r[0] for r in await judgments_by_rung(session, sweep.id)}) == judged


async def judgments_by_rung(session, sweep_id: int) -> list[tuple[int, int]]:
    rows = await session.execute(
        select(SweepRung.rung, SweepRung.job_id).where(SweepRung.sweep_id == sweep_id)
    )
    return [tuple(row) for row in rows]


async def test_tpe_over_objectives_learns_from_finished_trials_by_objective_name(session, key):
    definition = SweepCreate.model_validate(
        {
            "name": "objectives",
            "base": small_spec(),
            "parameters": {"loop.objective": {"values": ["sampled_reverse_kl", "jsd"]}},
            "method": "tpe",
            "metric": {"name": "opd/reverse_kl_mean", "goal": "minimize"},
            "max_trials": 3,
            "parallel": 1,
            "seed": 0,
        }
    )
    sweep, _ = await create_sweep(session, key.team.id, definition)
    first = (await step(session, sweep.id)).created
    await finish(session, first)

    second = (await step(session, sweep.id)).created

    assert len(first) == 1 and len(second) == 1
    kinds = [job.spec["loop"]["objective"]["kind"] for job in await trials_of(session, sweep.id)]
    assert set(kinds) <= {"sampled_reverse_kl", "jsd"} and len(kinds) == 2
