"""The sweep controller's decisions, each written to the database as it is made.

One pass over a sweep judges the trials at the rungs they reached since the last pass
(each judgment stored once, in `sweep_rungs`), stops the running trials that lost, ends the
sweep once its last trial ended, and creates trials until `parallel` of them are
unfinished. Every decision is a function of what the database holds, and every write is
safe to repeat: a judgment is an insert of (trial, rung) that keeps the first one stored,
a stop is a compare-and-set from `running` made by any pass that finds its judgment, the
end a compare-and-set from the sweep's `running`, and a new trial an insert of (sweep,
trial number), unique per sweep. So a controller killed at
any point loses nothing (its successor makes the same decisions from the same rows) and
two controllers racing double nothing (the loser's insert or update finds the row taken).
A lease (`Sweep.lease_owner`) keeps one process advancing a sweep at a time, and a trial is
inserted only in a transaction that sees its sweep running under that lease, so a
cancelled sweep starts nothing. Each trial's spec is admitted as any job's
(app/jobs/admission.py); one refused is stored `failed` with the reason, and the search goes on.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import timedelta

from optuna.trial import TrialState
from sqlalchemy import or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from app.core.config import Settings
from app.core.tables import utcnow
from app.jobs.admission import admit
from app.jobs.continuation import editable
from app.jobs.errors import IllegalTransition, SpecRefused
from app.jobs.limits import Limits, QueueFull
from app.jobs.schemas import TERMINAL_STATUSES, EventLevel, JobAction, JobStatus
from app.jobs.store import apply_action, compare_and_set, create_job
from app.jobs.tables import Job
from app.jobs.transitions import Plan
from app.sweeps.early_stopping import Judgment, decide, pending_rungs
from app.sweeps.rungs import latest_judgments, points_at, record_judgments, values_judged_at
from app.sweeps.schemas import EarlyStop, SweepStatus
from app.sweeps.search import (
    InvalidTrial,
    Observation,
    as_swept,
    get_path,
    planned_trials,
    suggest,
    trial_spec,
)
from app.sweeps.store import (
    EARLY_STOPPED,
    SweepState,
    cancel_trials,
    end_sweep,
    get_sweep,
    read_state,
)
from app.sweeps.tables import Sweep
from kernel.spec import JobSpec

SPEC_REFUSED = "spec_refused"


@dataclass
class Pass:
    """What one pass over a sweep did."""

    created: list[int] = field(default_factory=list)
    """Trial jobs created (queued; the caller sends them to the queue)."""
    refused: list[int] = field(default_factory=list)
    """Trial jobs created `failed`: admission refused their spec."""
    stopped: list[int] = field(default_factory=list)
    ended: SweepStatus | None = None


async def claim_sweeps(session: AsyncSession, owner: str, lease_seconds: float) -> list[int]:
    """Take (or keep) the lease of every running sweep that no live controller holds."""
    now = utcnow()
    result = await session.execute(
        update(Sweep)
        .where(
            Sweep.status == SweepStatus.running,
            or_(
                Sweep.lease_owner.is_(None),
                Sweep.lease_owner == owner,
                Sweep.lease_until < now,
            ),
        )
        .values(lease_owner=owner, lease_until=now + timedelta(seconds=lease_seconds))
        .returning(Sweep.id)
        .execution_options(synchronize_session=False)
    )
    claimed = sorted(result.scalars())
    await session.commit()
    return claimed


def observation(state: SweepState, job: Job) -> Observation:
    """A trial as the search sees it: succeeded = complete with its last value; stopped
    early = pruned; failed or cancelled = failed; the rest still running."""
    point = state.last(job)
    metric = point[1] if point else None
    values = {path: as_swept(get_path(job.spec, path)) for path in state.definition.parameters}
    if job.status == JobStatus.succeeded:
        return Observation(values, TrialState.COMPLETE, metric)
    if job.stop_reason == EARLY_STOPPED:
        return Observation(values, TrialState.PRUNED, metric)
    if JobStatus(job.status) in TERMINAL_STATUSES:
        return Observation(values, TrialState.FAIL)
    return Observation(values, TrialState.RUNNING)


async def judge_rungs(
    session: AsyncSession, state: SweepState, rule: EarlyStop, deadline: float | None
) -> None:
    """Judge every trial at the rungs it reached since it was last judged
    (app/sweeps/early_stopping.py says how), lowest rung first, storing each rung's
    judgments as they are made. Past the deadline no further rung is taken up: the next
    pass carries on from the stored ones."""
    sweep_id = state.sweep.id or 0
    maximize = state.definition.metric.goal == "maximize"
    latest = await latest_judgments(session, Job.sweep_id == sweep_id)
    pending = {
        job.id or 0: pending_rungs(rule, job.total_steps, job.steps_done, latest.get(job.id or 0))
        for job in state.trials
    }
    while reached := {job_id: rungs[0] for job_id, rungs in pending.items() if rungs}:
        rung = min(reached.values())
        arriving = [job_id for job_id, at in reached.items() if at == rung]
        values = await points_at(session, state.definition.metric.name, arriving, rung)
        recorded = await values_judged_at(session, sweep_id, rung)
        at_rung = {job_id: values.get(job_id) for job_id in arriving}
        kept = decide(rule, maximize, recorded, at_rung)
        competing = len(recorded) + len(arriving)
        await record_judgments(
            session,
            sweep_id,
            {
                job_id: Judgment(rung, value, kept[job_id], competing)
                for job_id, value in at_rung.items()
            },
        )
        for job_id in arriving:
            pending[job_id] = pending[job_id][1:] if kept[job_id] else []
        if deadline is not None and time.monotonic() > deadline:
            return


async def stop_losers(
    session: AsyncSession, state: SweepState, deadline: float | None = None
) -> list[int]:
    """Judge the trials at the rungs they reached, then ask every running trial whose
    stored judgment says it lost to stop (cancel, `early_stopped`): a stop interrupted by a
    crash is made by the next pass."""
    rule = state.definition.early_stop
    if rule is None:
        return []
    await judge_rungs(session, state, rule, deadline)
    latest = await latest_judgments(session, Job.sweep_id == state.sweep.id)
    await session.rollback()
    stopped = []
    for job in state.trials:
        judged = latest.get(job.id or 0)
        if job.status != JobStatus.running or judged is None or judged.kept:
            continue
        plan = Plan(
            JobStatus.cancelling,
            f"Early stopped by sweep {state.sweep.id} ({rule.type}): "
            f"{state.definition.metric.name} lost at step {judged.rung} "
            f"(against {judged.competing - 1} other trial(s) there)",
            {"requested_action": JobAction.cancel, "stop_reason": EARLY_STOPPED},
        )
        if await compare_and_set(session, job, plan, event_data={"rung": judged.rung}):
            stopped.append(job.id or 0)
    return stopped


async def add_trials(
    session: AsyncSession,
    state: SweepState,
    limits: Limits,
    done: Pass,
    settings: Settings | None = None,
) -> None:
    """Create trials up to `parallel` unfinished ones and the sweep's planned count; stop
    at the team's queued limit (the next pass tries again), at a trial that exists, or at a
    sweep no longer running and held as `state` read it. `settings`: the rules each trial
    is admitted by (None: the environment's)."""
    definition, sweep = state.definition, state.sweep
    assert sweep.id is not None and definition.base is not None
    settings = settings or Settings()
    base = editable(definition.base)  # a sweep stored with its base's paths filled
    history = [observation(state, job) for job in state.trials]
    unfinished = sum(JobStatus(job.status) not in TERMINAL_STATUSES for job in state.trials)
    number = max((job.sweep_trial or 0 for job in state.trials), default=0)
    while unfinished < definition.parallel and number < planned_trials(definition):
        number += 1
        values = suggest(definition, number, history)
        spec = trial_spec(base, values, f"{sweep.name}-{number}"[:200])
        try:
            trial = await insert_trial(session, sweep, number, spec, limits, settings)
        except (QueueFull, IntegrityError):
            await session.rollback()
            return
        if trial is None:
            return
        if trial.status == JobStatus.failed:
            done.refused.append(trial.id or 0)
            history.append(Observation(values, TrialState.FAIL))
            continue
        done.created.append(trial.id or 0)
        history.append(Observation(values, TrialState.RUNNING))
        unfinished += 1


async def insert_trial(
    session: AsyncSession,
    sweep: Sweep,
    number: int,
    spec: JobSpec,
    limits: Limits,
    settings: Settings,
) -> Job | None:
    """Trial `number` as a job, its spec admitted as any job's is: queued, or stored
    `failed` with the refusal as its error when admission refuses it (nothing runs). It is
    inserted only in a transaction that first marks the sweep row, on the condition that
    the sweep is running and held as it was read (`held`), so a cancel either comes first
    and no trial is inserted, or waits for the insert and then cancels the trial. None:
    the sweep ended or changed hands."""
    try:
        admitted, refusal = await admit(session, sweep.team_id, spec, settings), None
    except SpecRefused as refused:
        admitted, refusal = spec, refused
    await session.commit()  # the admission's reads; the insert's transaction starts here
    if not await held(session, sweep):
        await session.rollback()
        return None
    trial = (
        await create_job(
            session, sweep.team_id, admitted, limits=limits, trial=(sweep.id, number), commit=False
        )
    ).job
    if refusal is not None:
        plan = Plan(
            JobStatus.failed,
            f"Failed ({SPEC_REFUSED}): {refusal}",
            {"error_code": SPEC_REFUSED, "error_message": str(refusal)},
        )
        if not await compare_and_set(
            session, trial, plan, event_level=EventLevel.error, commit=False
        ):
            return None
        trial.status = JobStatus.failed
    await session.commit()
    return trial


async def held(session: AsyncSession, sweep: Sweep) -> bool:
    """In the caller's transaction: whether the sweep is still running and leased to the
    controller `sweep` was read with. A conditional UPDATE, so that the sweep row stays
    locked until the transaction ends (Postgres: a cancel's update of it waits; SQLite:
    one writer at a time)."""
    result = await session.execute(
        update(Sweep)
        .where(
            Sweep.id == sweep.id,
            Sweep.status == SweepStatus.running,
            Sweep.lease_owner == sweep.lease_owner,
        )
        .values(updated_at=utcnow())
        .execution_options(synchronize_session=False)
    )
    return result.rowcount == 1


async def cancel_stray_trials(session: AsyncSession) -> list[int]:
    """Cancel every unfinished trial of a sweep that has ended (one whose cancel was cut
    short before it reached its trials, or stored before trials were inserted under the
    sweep's lock); returns the trials asked to stop."""
    query = (
        select(Job.id)
        .join(Sweep, Sweep.id == Job.sweep_id)
        .where(Sweep.status != SweepStatus.running, Job.status.not_in(TERMINAL_STATUSES))
    )
    strays = list((await session.execute(query)).scalars())
    await session.rollback()
    cancelled = []
    for job_id in strays:
        try:
            if (await apply_action(session, job_id, JobAction.cancel)).changed:
                cancelled.append(job_id)
        except IllegalTransition:
            continue  # it ended meanwhile
    return cancelled


async def advance(
    session: AsyncSession,
    sweep_id: int,
    owner: str,
    limits: Limits,
    settings: Settings | None = None,
    deadline: float | None = None,
) -> Pass:
    """One pass over a sweep this controller holds the lease of (`settings`: the rules its
    trials are admitted by; None: the environment's); judging stops taking up rungs past
    `deadline` (time.monotonic)."""
    done = Pass()
    sweep = await get_sweep(session, sweep_id)
    if sweep.status != SweepStatus.running or sweep.lease_owner != owner:
        return done
    state = await read_state(session, sweep)
    done.stopped = await stop_losers(session, state, deadline)
    finished = all(JobStatus(job.status) in TERMINAL_STATUSES for job in state.trials)
    if finished and len(state.trials) >= planned_trials(state.definition):
        if await end_sweep(session, sweep, SweepStatus.completed):
            done.ended = SweepStatus.completed
        return done
    try:
        await add_trials(session, state, limits, done, settings)
    except InvalidTrial as error:
        if await end_sweep(session, sweep, SweepStatus.failed, str(error)):
            done.ended = SweepStatus.failed
        await cancel_trials(session, sweep_id)
    return done
