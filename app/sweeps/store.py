"""Sweeps in the database: store one, read one with its trials, end one.

A sweep's trials are the jobs that name it; what a trial tried is read back from its spec
(the values at the parameters' paths), its metric from the last point its job row keeps
(`metric_ends`), and its early-stopping judgments from `sweep_rungs`: reading a sweep reads
no metric point, however long its trials.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession

from app.core.config import DEFAULT_MAX_SPEC_BYTES
from app.core.db import commit_or_flush, detach
from app.core.documents import stored_json
from app.core.tables import utcnow
from app.jobs.errors import IllegalTransition
from app.jobs.schemas import TERMINAL_STATUSES, JobAction, JobStatus
from app.jobs.store import apply_action
from app.jobs.tables import Job
from app.sweeps.early_stopping import Judgment
from app.sweeps.errors import SweepNotFound
from app.sweeps.rungs import latest_judgments
from app.sweeps.schemas import (
    RungPublic,
    SweepCreate,
    SweepDetail,
    SweepMetric,
    SweepPublic,
    SweepStatus,
    TrialPublic,
)
from app.sweeps.search import get_path, planned_trials
from app.sweeps.tables import Sweep
from app.webhooks.outbox import add_deliveries
from app.webhooks.schemas import WebhookEvent

EARLY_STOPPED = "early_stopped"


async def create_sweep(
    session: AsyncSession,
    team_id: int,
    definition: SweepCreate,
    max_bytes: int = DEFAULT_MAX_SPEC_BYTES,
    *,
    commit: bool = True,
) -> Sweep:
    """Store a running sweep (its base already validated: `base_job`'s spec, if it names
    one, is its base); the controller starts its trials (commit=False: the caller
    commits). A definition larger than `max_bytes` is not stored: TooLargeToStore."""
    now = utcnow()
    stored = definition.model_dump(mode="json", exclude={"base_job"})
    sweep = Sweep(
        team_id=team_id,
        name=definition.name,
        definition=stored_json(stored, "the sweep's definition", max_bytes),
        base_job_id=definition.base_job,
        created_at=now,
        updated_at=now,
    )
    session.add(sweep)
    await commit_or_flush(session, commit)
    return detach(session, sweep)


async def get_sweep(session: AsyncSession, sweep_id: int, team_id: int | None = None) -> Sweep:
    """The sweep, read fresh; `team_id` None means any team (admin)."""
    query = select(Sweep).where(Sweep.id == sweep_id).execution_options(populate_existing=True)
    if team_id is not None:
        query = query.where(Sweep.team_id == team_id)
    sweep = (await session.execute(query)).scalar_one_or_none()
    if sweep is None:
        raise SweepNotFound(f"sweep {sweep_id} not found")
    return detach(session, sweep)


async def trials_of(session: AsyncSession, sweep_id: int) -> list[Job]:
    """The sweep's trial jobs, by trial number."""
    rows = await session.execute(
        select(Job)
        .where(Job.sweep_id == sweep_id)
        .order_by(Job.sweep_trial)
        .execution_options(populate_existing=True)
    )
    return [detach(session, job) for job in rows.scalars()]


Point = tuple[int, float | None]


class TrialRow(Protocol):
    """What a sweep's summary reads of a trial: a Job, or a row of its columns."""

    id: int | None
    sweep_trial: int | None
    status: str
    steps_done: int
    total_steps: int
    stop_reason: str | None
    metric_ends: dict[str, list[float | None]]


def last_point(trial: TrialRow, metric: str) -> Point | None:
    """The trial's last point of the metric (value None: not finite), kept on the job row
    as steps are recorded (kernel/summary.py): no metric read."""
    ends = trial.metric_ends.get(metric)
    return None if ends is None else (int(ends[2] or 0), ends[3])


@dataclass(frozen=True)
class SweepState:
    """A sweep as read at one moment: its definition and its trials."""

    sweep: Sweep
    definition: SweepCreate
    trials: list[Job]

    def last(self, job: Job) -> Point | None:
        return last_point(job, self.definition.metric.name)


async def read_state(session: AsyncSession, sweep: Sweep) -> SweepState:
    definition = SweepCreate.model_validate(sweep.definition)
    trials = await trials_of(session, sweep.id or 0)
    await session.rollback()
    return SweepState(sweep, definition, trials)


def better(a: float, b: float, maximize: bool) -> bool:
    return a > b if maximize else a < b


def comparable(trial: TrialRow, metric: str) -> float | None:
    """A succeeded trial's metric (a stopped or unfinished trial's is not comparable)."""
    point = last_point(trial, metric)
    return point[1] if point and trial.status == JobStatus.succeeded else None


def best_of(trials: Sequence[TrialRow], metric: SweepMetric) -> TrialRow | None:
    """The succeeded trial with the best metric, the first of equals."""
    maximize = metric.goal == "maximize"
    best, best_value = None, None
    for trial in trials:
        value = comparable(trial, metric.name)
        if value is not None and (best_value is None or better(value, best_value, maximize)):
            best, best_value = trial, value
    return best


def trial_public(
    trial: TrialRow,
    values: dict[str, Any],
    definition: SweepCreate,
    best_so_far: float | None,
    judged: Judgment | None,
) -> TrialPublic:
    step, value = last_point(trial, definition.metric.name) or (None, None)
    return TrialPublic(
        number=trial.sweep_trial or 0,
        job_id=trial.id or 0,
        status=JobStatus(trial.status),
        values=values,
        metric=value,
        metric_step=step,
        best_so_far=best_so_far,
        steps_done=trial.steps_done,
        total_steps=trial.total_steps,
        stop_reason=trial.stop_reason,
        judged=None
        if judged is None
        else RungPublic(
            step=judged.rung, value=judged.value, kept=judged.kept, competing=judged.competing
        ),
    )


def sweep_fields(
    sweep: Sweep, definition: SweepCreate, trials: Sequence[TrialRow], best: TrialPublic | None
) -> dict[str, Any]:
    """What SweepPublic says of a sweep, from its trials' rows and its best trial."""
    saved = sum(
        t.total_steps - t.steps_done
        for t in trials
        if t.stop_reason == EARLY_STOPPED and t.status == JobStatus.cancelled
    )
    assert sweep.id is not None and definition.base is not None
    return {
        "id": sweep.id,
        "team_id": sweep.team_id,
        "name": sweep.name,
        "status": SweepStatus(sweep.status),
        "method": definition.method,
        "metric": definition.metric,
        "parameters": definition.parameters,
        "max_trials": definition.max_trials,
        "parallel": definition.parallel,
        "seed": definition.seed,
        "early_stop": definition.early_stop,
        "base_job": sweep.base_job_id,
        "base": definition.base,
        "created_at": sweep.created_at,
        "finished_at": sweep.finished_at,
        "error": sweep.error_message,
        "trials_planned": planned_trials(definition),
        "trials_created": len(trials),
        "best": best,
        "steps_saved": saved,
    }


TRIAL_COLUMNS = (
    Job.id,
    Job.sweep_id,
    Job.sweep_trial,
    Job.status,
    Job.steps_done,
    Job.total_steps,
    Job.stop_reason,
    Job.metric_ends,
)
"""What reading a sweep needs of its trials' rows: not their specs, nor any metric point."""


def value_column(path: str, index: int) -> Any:
    """The value at a parameter's dotted path of a trial's spec, read in the database (the
    spec itself is not read)."""
    return Job.spec[tuple(path.split("."))].label(f"value_{index}")


async def read_sweep(
    session: AsyncSession, sweep_id: int, team_id: int | None = None
) -> SweepDetail:
    """The sweep and every trial, with `best_so_far` over the succeeded trials up to it:
    three queries (the sweep, its trials' columns with their values, their judgments)."""
    sweep = await get_sweep(session, sweep_id, team_id)
    definition = SweepCreate.model_validate(sweep.definition)
    paths = list(definition.parameters)
    rows = await session.execute(
        select(*TRIAL_COLUMNS, *(value_column(path, i) for i, path in enumerate(paths)))
        .where(Job.sweep_id == sweep_id)
        .order_by(Job.sweep_trial)
    )
    trials = list(rows)
    judged = await latest_judgments(session, Job.sweep_id == sweep_id)
    await session.rollback()
    maximize = definition.metric.goal == "maximize"
    views = []
    best: float | None = None
    for row in trials:
        value = comparable(row, definition.metric.name)
        if value is not None and (best is None or better(value, best, maximize)):
            best = value
        values = {path: row[len(TRIAL_COLUMNS) + i] for i, path in enumerate(paths)}
        views.append(trial_public(row, values, definition, best, judged.get(row.id)))
    top = best_of(trials, definition.metric)
    shown = next((view for view in views if top is not None and view.job_id == top.id), None)
    return SweepDetail(**sweep_fields(sweep, definition, trials, shown), trials=views)


async def list_sweeps(
    session: AsyncSession, team_id: int | None, after: int | None, limit: int
) -> tuple[list[SweepPublic], int | None]:
    """A page of sweeps, newest first, and the cursor of the next page (None: the last).
    Four queries whatever the page holds: the sweeps, their trials' columns, and the best
    trials' specs and judgments."""
    query = select(Sweep).order_by(Sweep.id.desc()).limit(limit + 1)
    if team_id is not None:
        query = query.where(Sweep.team_id == team_id)
    if after is not None:
        query = query.where(Sweep.id < after)
    sweeps = [detach(session, sweep) for sweep in (await session.execute(query)).scalars()]
    shown = sweeps[:limit]
    rows = await session.execute(
        select(*TRIAL_COLUMNS)
        .where(Job.sweep_id.in_([sweep.id for sweep in shown]))
        .order_by(Job.sweep_id, Job.sweep_trial)
    )
    trials: dict[int, list[Any]] = {sweep.id or 0: [] for sweep in shown}
    for row in rows:
        trials[row.sweep_id].append(row)
    definitions = {sweep.id: SweepCreate.model_validate(sweep.definition) for sweep in shown}
    bests = {
        sweep.id: best_of(trials[sweep.id or 0], definitions[sweep.id].metric) for sweep in shown
    }
    best_ids = [best.id for best in bests.values() if best is not None]
    specs = dict(
        (await session.execute(select(Job.id, Job.spec).where(Job.id.in_(best_ids)))).all()
    )
    judged = await latest_judgments(session, Job.id.in_(best_ids))
    await session.rollback()
    page = []
    for sweep in shown:
        definition, best = definitions[sweep.id], bests[sweep.id]
        public = None
        if best is not None:
            values = {path: get_path(specs[best.id], path) for path in definition.parameters}
            value = comparable(best, definition.metric.name)
            public = trial_public(best, values, definition, value, judged.get(best.id or 0))
        page.append(SweepPublic(**sweep_fields(sweep, definition, trials[sweep.id or 0], public)))
    return page, (sweeps[limit - 1].id if len(sweeps) > limit else None)


async def end_sweep(
    session: AsyncSession, sweep: Sweep, status: SweepStatus, error: str | None = None
) -> bool:
    """Move a running sweep to its final status (compare-and-set: once), with its
    `sweep.completed` delivery in the same transaction. False if it had ended already."""
    now = utcnow()
    result = await session.execute(
        update(Sweep)
        .where(Sweep.id == sweep.id, Sweep.status == SweepStatus.running)
        .values(
            status=status,
            updated_at=now,
            finished_at=now,
            error_message=error,
            lease_owner=None,
            lease_until=None,
        )
        .execution_options(synchronize_session=False)
    )
    if result.rowcount != 1:
        await session.rollback()
        return False
    data = {"sweep_id": sweep.id, "name": sweep.name, "team_id": sweep.team_id, "status": status}
    await add_deliveries(session, sweep.team_id, None, WebhookEvent.sweep_completed, data, now)
    await session.commit()
    return True


async def cancel_trials(session: AsyncSession, sweep_id: int) -> None:
    """Cancel every trial that has not ended (a running one stops at a step boundary)."""
    for job in await trials_of(session, sweep_id):
        if JobStatus(job.status) in TERMINAL_STATUSES:
            continue
        try:
            await apply_action(session, job.id or 0, JobAction.cancel)
        except IllegalTransition:
            continue  # it ended meanwhile


async def cancel_sweep(session: AsyncSession, sweep_id: int, team_id: int | None) -> SweepDetail:
    """End the sweep as cancelled and cancel its trials; a repeat cancels what is left."""
    sweep = await get_sweep(session, sweep_id, team_id)
    await end_sweep(session, sweep, SweepStatus.cancelled)
    await cancel_trials(session, sweep_id)
    return await read_sweep(session, sweep_id)
