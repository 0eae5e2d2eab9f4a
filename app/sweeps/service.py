"""Sweeps as every door uses them: creating one (admitted by app/sweeps/admission.py,
stored, audited), reading one or a page of them as the API shows them, cancelling one."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from app.audit.store import record_audit
from app.auth.keys import Principal
from app.core.config import Settings
from app.core.db import detach
from app.core.idempotency import Idempotency
from app.jobs.schemas import JobStatus
from app.jobs.service import Door
from app.jobs.tables import Job
from app.sweeps.admission import admit_sweep
from app.sweeps.early_stopping import Judgment
from app.sweeps.ranking import TrialRow, best_of, better, comparable, last_point
from app.sweeps.rungs import latest_judgments
from app.sweeps.schemas import (
    RungPublic,
    SweepCreate,
    SweepDetail,
    SweepPublic,
    SweepStatus,
    TrialPublic,
)
from app.sweeps.search import as_swept, get_path, planned_trials
from app.sweeps.store import (
    EARLY_STOPPED,
    TRIAL_COLUMNS,
    cancel_trials,
    create_sweep,
    end_sweep,
    get_sweep,
    value_column,
)
from app.sweeps.tables import Sweep


async def submit_definition(
    session: AsyncSession,
    principal: Principal,
    body: SweepCreate,
    settings: Settings,
    door: Door,
    idempotency: Idempotency | None = None,
) -> tuple[Sweep, bool]:
    """Admit a sweep and store it; the workers' controller starts its trials. (sweep,
    False) for a repeat of an idempotent request: the sweep first made, nothing stored or
    audited again. Raises SpecRefused, IdempotencyMismatch, or JobNotFound for a
    `base_job` the caller cannot read."""
    definition = await admit_sweep(session, principal, body, settings)
    sweep, made = await create_sweep(
        session, principal.team_id, definition, settings.max_spec_bytes, idempotency, commit=False
    )
    if made:
        await record_audit(
            session, principal, "sweep.create", f"sweep {sweep.id}", door.status_code, door.detail
        )
    return sweep, made


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
        values={path: as_swept(value) for path, value in values.items()},
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


async def cancel_sweep(session: AsyncSession, sweep_id: int, team_id: int | None) -> SweepDetail:
    """End the sweep as cancelled and cancel its trials; a repeat cancels what is left."""
    sweep = await get_sweep(session, sweep_id, team_id)
    await end_sweep(session, sweep, SweepStatus.cancelled)
    await cancel_trials(session, sweep_id)
    return await read_sweep(session, sweep_id)
