"""Sweeps in the database: store one, read one with its trials, end one.

A sweep's trials are the jobs that name it; what a trial tried is read back from its spec
(the values at the parameters' paths), and its metric from its step rows, so the sweep
row holds nothing the jobs already say.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession

from app.core.config import DEFAULT_MAX_SPEC_BYTES
from app.early_stopping import Curve
from app.models import (
    TERMINAL_STATUSES,
    Job,
    JobAction,
    JobStatus,
    StepMetric,
    Sweep,
    SweepCreate,
    SweepDetail,
    SweepPublic,
    SweepStatus,
    TrialPublic,
    WebhookEvent,
    utcnow,
)
from app.store.audit import settle
from app.store.errors import IllegalTransition, SweepNotFound, stored_json
from app.store.jobs import apply_action
from app.store.outbox import stage
from app.store.rows import detach
from app.sweep_search import get_path, planned_trials

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
    await settle(session, commit)
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


async def metric_curves(
    session: AsyncSession, job_ids: Sequence[int], metric: str
) -> dict[int, list[tuple[int, float | None]]]:
    """Each job's recorded points of one metric, in step order (one number per row read)."""
    value = StepMetric.metrics[metric].as_float()
    rows = await session.execute(
        select(StepMetric.job_id, StepMetric.step, value)
        .where(StepMetric.job_id.in_(job_ids), value.is_not(None))
        .order_by(StepMetric.job_id, StepMetric.step)
    )
    curves: dict[int, list[tuple[int, float | None]]] = {job_id: [] for job_id in job_ids}
    for job_id, step, point in rows:
        curves[job_id].append((step, point))
    return curves


@dataclass(frozen=True)
class SweepState:
    """A sweep as read at one moment: its definition, its trials and their curves."""

    sweep: Sweep
    definition: SweepCreate
    trials: list[Job]
    curves: dict[int, list[tuple[int, float | None]]]

    def curve(self, job: Job) -> Curve:
        assert job.id is not None
        return self.curves.get(job.id, [])


async def read_state(session: AsyncSession, sweep: Sweep) -> SweepState:
    definition = SweepCreate.model_validate(sweep.definition)
    trials = await trials_of(session, sweep.id or 0)
    curves = await metric_curves(
        session, [job.id for job in trials if job.id is not None], definition.metric.name
    )
    await session.rollback()
    return SweepState(sweep, definition, trials, curves)


def better(a: float, b: float, maximize: bool) -> bool:
    return a > b if maximize else a < b


def trial_view(state: SweepState) -> list[TrialPublic]:
    """Every trial with its values and metric; `best_so_far` over the succeeded trials up
    to it (a stopped or unfinished trial's last value is not comparable)."""
    maximize = state.definition.metric.goal == "maximize"
    best: float | None = None
    views = []
    for job in state.trials:
        curve = state.curve(job)
        step, value = curve[-1] if curve else (None, None)
        if job.status == JobStatus.succeeded and value is not None:
            best = value if best is None or better(value, best, maximize) else best
        views.append(
            TrialPublic(
                number=job.sweep_trial or 0,
                job_id=job.id or 0,
                status=JobStatus(job.status),
                values={path: get_path(job.spec, path) for path in state.definition.parameters},
                metric=value,
                metric_step=step,
                best_so_far=best,
                steps_done=job.steps_done,
                total_steps=job.total_steps,
                stop_reason=job.stop_reason,
            )
        )
    return views


def sweep_view(state: SweepState) -> SweepDetail:
    definition, sweep = state.definition, state.sweep
    trials = trial_view(state)
    finished = [t for t in trials if t.status == JobStatus.succeeded and t.metric is not None]
    best = None
    if finished:
        best = next(t for t in finished if t.metric == finished[-1].best_so_far)
    saved = sum(
        t.total_steps - t.steps_done
        for t in trials
        if t.stop_reason == EARLY_STOPPED and t.status == JobStatus.cancelled
    )
    assert sweep.id is not None and definition.base is not None
    return SweepDetail(
        id=sweep.id,
        team_id=sweep.team_id,
        name=sweep.name,
        status=SweepStatus(sweep.status),
        method=definition.method,
        metric=definition.metric,
        parameters=definition.parameters,
        max_trials=definition.max_trials,
        parallel=definition.parallel,
        seed=definition.seed,
        early_stop=definition.early_stop,
        base_job=sweep.base_job_id,
        base=definition.base,
        created_at=sweep.created_at,
        finished_at=sweep.finished_at,
        error=sweep.error_message,
        trials_planned=planned_trials(definition),
        trials_created=len(trials),
        best=best,
        steps_saved=saved,
        trials=trials,
    )


async def read_sweep(
    session: AsyncSession, sweep_id: int, team_id: int | None = None
) -> SweepDetail:
    return sweep_view(await read_state(session, await get_sweep(session, sweep_id, team_id)))


async def list_sweeps(
    session: AsyncSession, team_id: int | None, after: int | None, limit: int
) -> tuple[list[SweepPublic], int | None]:
    """A page of sweeps, newest first, and the cursor of the next page (None: the last)."""
    query = select(Sweep).order_by(Sweep.id.desc()).limit(limit + 1)
    if team_id is not None:
        query = query.where(Sweep.team_id == team_id)
    if after is not None:
        query = query.where(Sweep.id < after)
    sweeps = [detach(session, sweep) for sweep in (await session.execute(query)).scalars()]
    page = []
    for sweep in sweeps[:limit]:
        detail = sweep_view(await read_state(session, sweep))
        page.append(SweepPublic.model_validate(detail.model_dump(exclude={"trials"})))
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
    await stage(session, sweep.team_id, None, WebhookEvent.sweep_completed, data, now)
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
