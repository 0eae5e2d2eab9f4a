"""The sweep controller's decisions, each written to the database as it is made.

One pass over a sweep stops the trials that lost at a rung, ends the sweep once its last
trial ended, and creates trials until `parallel` of them are unfinished. Every decision is
a function of what the database holds, and every write is safe to repeat: a stop is a
compare-and-set from `running`, the end a compare-and-set from the sweep's `running`, and a
new trial an insert of (sweep, trial number), unique per sweep. So a controller killed at
any point loses nothing (its successor makes the same decisions from the same rows) and
two controllers racing double nothing (the loser's insert or update finds the row taken).
A lease (`Sweep.lease_owner`) keeps one process advancing a sweep at a time, and a trial is
inserted only in a transaction that sees its sweep running under that lease, so a
cancelled sweep starts nothing. Each trial's spec is admitted as any job's
(app/admission.py); one refused is stored `failed` with the reason, and the search goes on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

from optuna.trial import TrialState
from sqlalchemy import or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from app.admission import SpecRefused, admit
from app.continuation import editable
from app.core.config import Settings
from app.early_stopping import stop_step
from app.models import (
    TERMINAL_STATUSES,
    EventLevel,
    Job,
    JobAction,
    JobStatus,
    Sweep,
    SweepStatus,
    utcnow,
)
from app.store.errors import IllegalTransition
from app.store.jobs import apply_action, compare_and_set, create_job
from app.store.limits import Limits, QueueFull
from app.store.sweeps import (
    EARLY_STOPPED,
    SweepState,
    cancel_trials,
    end_sweep,
    get_sweep,
    read_state,
)
from app.store.transitions import Plan
from app.sweep_search import (
    InvalidTrial,
    Observation,
    get_path,
    planned_trials,
    suggest,
    trial_spec,
)
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
    curve = state.curve(job)
    metric = curve[-1][1] if curve else None
    values = {path: get_path(job.spec, path) for path in state.definition.parameters}
    if job.status == JobStatus.succeeded:
        return Observation(values, TrialState.COMPLETE, metric)
    if job.stop_reason == EARLY_STOPPED:
        return Observation(values, TrialState.PRUNED, metric)
    if JobStatus(job.status) in TERMINAL_STATUSES:
        return Observation(values, TrialState.FAIL)
    return Observation(values, TrialState.RUNNING)


async def stop_losers(session: AsyncSession, state: SweepState) -> list[int]:
    """Ask every running trial that lost at a rung to stop (cancel, `early_stopped`)."""
    rule = state.definition.early_stop
    if rule is None:
        return []
    maximize = state.definition.metric.goal == "maximize"
    stopped = []
    for job in state.trials:
        if job.status != JobStatus.running:
            continue
        others = [state.curve(other) for other in state.trials if other.id != job.id]
        rung = stop_step(rule, state.curve(job), others, job.total_steps, maximize)
        if rung is None:
            continue
        plan = Plan(
            JobStatus.cancelling,
            f"Early stopped by sweep {state.sweep.id} ({rule.type}): "
            f"{state.definition.metric.name} lost at step {rung}",
            {"requested_action": JobAction.cancel, "stop_reason": EARLY_STOPPED},
        )
        if await compare_and_set(session, job, plan, event_data={"rung": rung}):
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
) -> Pass:
    """One pass over a sweep this controller holds the lease of (`settings`: the rules its
    trials are admitted by; None: the environment's)."""
    done = Pass()
    sweep = await get_sweep(session, sweep_id)
    if sweep.status != SweepStatus.running or sweep.lease_owner != owner:
        return done
    state = await read_state(session, sweep)
    done.stopped = await stop_losers(session, state)
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
