"""Submitting a job and creating a sweep, the same use case for every door (the API's
routes and the dashboard's forms): admitted (app/jobs/admission.py), stored, audited, and for a
job sent to the queue. Each door maps the refusals to its own answer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from app.audit.store import record_audit
from app.auth.keys import Principal
from app.core.config import Settings
from app.core.idempotency import Idempotency
from app.core.queue import JobQueue
from app.jobs.admission import admit
from app.jobs.dispatch import enqueue_job
from app.jobs.limits import Limits, QueueFull
from app.jobs.store import ActionResult, create_job
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
        target = f"job {result.job.id}"
        await record_audit(session, principal, "job.create", target, door.status_code, door.detail)
        await enqueue_job(session, queue, result.job.id)
    return result
