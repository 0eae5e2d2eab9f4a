"""The webhook outbox: the deliveries a job's change makes, written in the transaction of
that change, so a delivery exists exactly when the change does (a process that dies
before the commit leaves neither; the workers send what is committed)."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from app.models import Job, JobStatus, Webhook, WebhookDelivery, WebhookEvent

RETRY_FOR = timedelta(hours=24)
"""How long a delivery is retried (the Standard Webhooks schedule spans about a day)."""
TRANSITION_EVENTS = {
    JobStatus.succeeded: WebhookEvent.succeeded,
    JobStatus.failed: WebhookEvent.failed,
    JobStatus.cancelled: WebhookEvent.cancelled,
    JobStatus.paused: WebhookEvent.paused,
}


def message_id() -> str:
    """The delivery's `webhook-id`: receivers drop a message whose id they have seen."""
    return f"msg_{uuid.uuid4().hex}"


async def stage(
    session: AsyncSession,
    team_id: int,
    job_id: int | None,
    event: WebhookEvent,
    data: dict[str, Any],
    now: datetime,
) -> None:
    """Add a delivery of `event` for each of the team's webhooks that wants it, retried
    for RETRY_FOR (the caller commits)."""
    hooks = await session.execute(
        select(Webhook.id, Webhook.events).where(
            Webhook.team_id == team_id, Webhook.deleted_at.is_(None)
        )
    )
    payload = {"type": event.value, "timestamp": now.isoformat(), "data": data}
    for webhook_id, events in hooks:
        if event.value in events:
            session.add(
                WebhookDelivery(
                    webhook_id=webhook_id,
                    job_id=job_id,
                    event=event,
                    message_id=message_id(),
                    payload=payload,
                    created_at=now,
                    next_attempt_at=now,
                    retry_until=now + RETRY_FOR,
                )
            )


async def stage_job_event(
    session: AsyncSession, job: Job, target: JobStatus, values: dict[str, Any], now: datetime
) -> None:
    """The delivery a transition to `target` makes (succeeded, failed, cancelled, paused)."""
    event = TRANSITION_EVENTS.get(target)
    if event is None:
        return
    code = values.get("error_code", job.error_code)
    data = {
        "job_id": job.id,
        "name": job.name,
        "team_id": job.team_id,
        "status": target.value,
        "previous_status": job.status,
        "error": None
        if code is None
        else {"code": code, "message": values.get("error_message", job.error_message)},
        "final_weights_path": values.get("final_weights_path", job.final_weights_path),
        "last_state_path": values.get("last_state_path", job.last_state_path),
    }
    await stage(session, job.team_id, job.id, event, data, now)


async def stage_eval(
    session: AsyncSession,
    team_id: int,
    job_id: int,
    step: int,
    metrics: dict[str, float | None],
    now: datetime,
) -> None:
    """The delivery the job's final held-out eval makes (`job.eval_completed`)."""
    figures = {name: value for name, value in metrics.items() if name.startswith("eval/")}
    data = {"job_id": job_id, "team_id": team_id, "step": step, "metrics": figures}
    await stage(session, team_id, job_id, WebhookEvent.eval_completed, data, now)
