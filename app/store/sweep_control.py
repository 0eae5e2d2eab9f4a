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
A lease (`Sweep.lease_owner`) keeps one process advancing a sweep at a time.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import timedelta

from optuna.trial import TrialState
from sqlalchemy import or_, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from app.early_stopping import Judgment, decide, pending_rungs
from app.models import (
    TERMINAL_STATUSES,
    EarlyStop,
    Job,
    JobAction,
    JobStatus,
    Sweep,
    SweepStatus,
    utcnow,
)
from app.store.jobs import compare_and_set, create_job
from app.store.limits import Limits, QueueFull
from app.store.rungs import latest_judgments, points_at, record_judgments, values_judged_at
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


@dataclass
class Pass:
    """What one pass over a sweep did."""

    created: list[int] = field(default_factory=list)
    """Trial jobs created (queued; the caller sends them to the queue)."""
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
    values = {path: get_path(job.spec, path) for path in state.definition.parameters}
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
    """Judge every trial at the rungs it reached since it was last judged (app/early_stopping.py
    says how), lowest rung first, storing each rung's judgments as they are made. Past the
    deadline no further rung is taken up: the next pass carries on from the stored ones."""
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


async def add_trials(session: AsyncSession, state: SweepState, limits: Limits, done: Pass) -> None:
    """Create trials up to `parallel` unfinished ones and the sweep's planned count; stop
    at the team's queued limit (the next pass tries again) or at a trial that exists."""
    definition, sweep = state.definition, state.sweep
    assert sweep.id is not None and definition.base is not None
    history = [observation(state, job) for job in state.trials]
    unfinished = sum(JobStatus(job.status) not in TERMINAL_STATUSES for job in state.trials)
    number = max((job.sweep_trial or 0 for job in state.trials), default=0)
    while unfinished < definition.parallel and number < planned_trials(definition):
        number += 1
        values = suggest(definition, number, history)
        spec = trial_spec(definition.base, values, f"{sweep.name}-{number}"[:200])
        try:
            result = await create_job(
                session, sweep.team_id, spec, limits=limits, trial=(sweep.id, number)
            )
        except (QueueFull, IntegrityError):
            await session.rollback()
            return
        done.created.append(result.job.id or 0)
        history.append(Observation(values, TrialState.RUNNING))
        unfinished += 1


async def advance(
    session: AsyncSession, sweep_id: int, owner: str, limits: Limits, deadline: float | None = None
) -> Pass:
    """One pass over a sweep this controller holds the lease of; judging stops taking up
    rungs past `deadline` (time.monotonic)."""
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
        await add_trials(session, state, limits, done)
    except InvalidTrial as error:
        if await end_sweep(session, sweep, SweepStatus.failed, str(error)):
            done.ended = SweepStatus.failed
        await cancel_trials(session, sweep_id)
    return done
