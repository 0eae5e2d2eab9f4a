"""Submitting a job and creating a sweep, the same use case for every door (the API's
routes and the dashboard's forms): admitted (app/jobs/admission.py), stored, audited, and for a
job sent to the queue. Each door maps the refusals to its own answer."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from app.audit.store import record_audit
from app.auth.keys import Principal
from app.core.config import Settings
from app.core.idempotency import Idempotency
from app.core.queue import JobQueue
from app.core.tables import utcnow
from app.jobs.admission import admit
from app.jobs.dispatch import enqueue_job
from app.jobs.errors import SpecNotFound
from app.jobs.limits import Limits, QueueFull
from app.jobs.places import waiting_reason
from app.jobs.schemas import JobPublic, JobStatus, QueuePlace
from app.jobs.store import ActionResult, create_job
from app.jobs.uploads import files_kept
from app.jobs.workers import read_board
from kernel.spec import JobSpec


@dataclass(frozen=True)
class Door:
    """The way a request came in, as its audit entry records it: the status it is answered
    with, and what the entry adds (the dashboard's `via`)."""

    status_code: int
    detail: dict[str, Any] | None = None


API = Door(201)

DASHBOARD = Door(303, {"via": "dashboard"})


async def submit_spec(
    session: AsyncSession,
    principal: Principal,
    queue: JobQueue,
    settings: Settings,
    spec: JobSpec,
    idempotency: Idempotency | None,
    door: Door,
) -> ActionResult:
    """Admit `spec`, store it as a queued job of the caller's team and send it to the queue
    (a repeat of an idempotent request returns the job first made, `changed` False). Raises
    SpecRefused, IdempotencyMismatch, or QueueFull (audited; nothing stored)."""
    spec = await admit(session, principal.team_id, spec, settings)
    try:
        result = await create_job(
            session, principal.team_id, spec, idempotency, Limits.of(settings), commit=False
        )
    except QueueFull as full:
        detail = {"error": str(full), **(door.detail or {})}
        await record_audit(session, principal, "job.create", None, 429, detail)
        raise
    if result.changed:
        try:
            await files_kept(session, principal.team_id, spec)
        except SpecNotFound:
            await session.rollback()
            raise
        target = f"job {result.job.id}"
        await record_audit(session, principal, "job.create", target, door.status_code, door.detail)
        await enqueue_job(session, queue, result.job.id)
    return result


def live_window(settings: Settings) -> timedelta:
    """How recently a worker must have noted itself to count: it does on every requeue
    pass (OPD_REQUEUE_INTERVAL), and a pass may wait on the database."""
    return timedelta(seconds=max(settings.heartbeat_timeout, 2 * settings.requeue_interval))


async def queue_places(
    session: AsyncSession, jobs: Sequence[tuple[int, int]], settings: Settings
) -> dict[int, QueuePlace]:
    """Where each queued job of (job id, team id) pairs stands: one read of the queue for
    them all, none without a queued job."""
    if not jobs:
        return {}
    board = await read_board(session, Limits.of(settings), utcnow() - live_window(settings))
    return {job_id: board.place(job_id, team_id) for job_id, team_id in jobs}


def queue_reason(stored: str | None, place: QueuePlace | None) -> str | None:
    """Why a queued job waits: what was written on it (Redis away, its team's running
    limit), else what its place says."""
    return stored or (None if place is None else waiting_reason(place))


async def show_places(
    session: AsyncSession, bodies: Sequence[JobPublic], settings: Settings
) -> None:
    """Say on each queued job of `bodies` where it stands and why it waits."""
    waiting = [body for body in bodies if body.status == JobStatus.queued]
    places = await queue_places(session, [(body.id, body.team_id) for body in waiting], settings)
    for body in waiting:
        body.queue = places[body.id]
        body.queue_reason = queue_reason(body.queue_reason, body.queue)
