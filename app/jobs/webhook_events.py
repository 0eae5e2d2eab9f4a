"""What a job tells its team's webhooks: the delivery a transition or a final eval stages,
in the transaction that makes it."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from app.jobs.schemas import JobStatus
from app.jobs.tables import Job
from app.webhooks.outbox import add_deliveries
from app.webhooks.schemas import WebhookEvent
from kernel.team_view import masked_text, weights_name

TRANSITION_EVENTS = {
    JobStatus.succeeded: WebhookEvent.succeeded,
    JobStatus.failed: WebhookEvent.failed,
    JobStatus.cancelled: WebhookEvent.cancelled,
    JobStatus.paused: WebhookEvent.paused,
}


async def add_transition_deliveries(
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
        else {"code": code, "message": masked_text(values.get("error_message", job.error_message))},
        # A team's webhook gets the names a team's keys see, never a worker's folder.
        "final_weights_path": weights_name(
            values.get("final_weights_path", job.final_weights_path)
        ),
        "last_state_path": weights_name(values.get("last_state_path", job.last_state_path)),
    }
    await add_deliveries(session, job.team_id, job.id, event, data, now)


async def add_eval_deliveries(
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
    await add_deliveries(session, team_id, job_id, WebhookEvent.eval_completed, data, now)
