"""Sweeps in the database: store one, read one with its trials, end one.

A sweep's trials are the jobs that name it; what a trial tried is read back from its spec
(the values at the parameters' paths), its metric from the last point its job row keeps
(`metric_ends`), and its early-stopping judgments from `sweep_rungs`: reading a sweep reads
no metric point, however long its trials.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession

from app.core.config import DEFAULT_MAX_SPEC_BYTES
from app.core.db import commit_or_flush, detach
from app.core.documents import stored_json
from app.core.idempotency import Idempotency, insert_once
from app.core.tables import utcnow
from app.jobs.errors import IllegalTransition
from app.jobs.schemas import TERMINAL_STATUSES, JobAction, JobStatus
from app.jobs.store import apply_action
from app.jobs.tables import Job
from app.sweeps.errors import SweepNotFound
from app.sweeps.ranking import Point, last_point
from app.sweeps.schemas import (
    SweepCreate,
    SweepStatus,
)
from app.sweeps.tables import Sweep
from app.webhooks.outbox import add_deliveries
from app.webhooks.schemas import WebhookEvent

EARLY_STOPPED = "early_stopped"


async def create_sweep(
    session: AsyncSession,
    team_id: int,
    definition: SweepCreate,
    max_bytes: int = DEFAULT_MAX_SPEC_BYTES,
    idempotency: Idempotency | None = None,
    *,
    commit: bool = True,
) -> tuple[Sweep, bool]:
    """Store a running sweep (its base already validated: `base_job`'s spec, if it names
    one, is its base); the controller starts its trials (commit=False: the caller
    commits). (sweep, True) when made; (the sweep first made, False) for a repeat of the
    request its Idempotency-Key came with; IdempotencyMismatch for another request. A
    definition larger than `max_bytes` is not stored: TooLargeToStore."""
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
    sweep, made = await insert_once(session, sweep, idempotency, "sweep")
    if not made:
        return sweep, False
    await commit_or_flush(session, commit)
    return detach(session, sweep), True


async def sweep_keyed(session: AsyncSession, team_id: int, idempotency: Idempotency) -> bool:
    """Whether the team made a sweep with this Idempotency-Key (a retry starts nothing new)."""
    query = select(Sweep.id).where(
        Sweep.team_id == team_id, Sweep.idempotency_key == idempotency.key
    )
    return (await session.execute(query)).first() is not None


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
