"""The webhook outbox: the deliveries a job's change makes, written in the transaction of
that change, so a delivery exists exactly when the change does (a process that dies
before the commit leaves neither; the workers send what is committed)."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from app.webhooks.schemas import WebhookEvent
from app.webhooks.tables import Webhook, WebhookDelivery

RETRY_FOR = timedelta(hours=24)
"""How long a delivery is retried (the Standard Webhooks schedule spans about a day)."""


def message_id() -> str:
    """The delivery's `webhook-id`: receivers drop a message whose id they have seen."""
    return f"msg_{uuid.uuid4().hex}"


async def add_deliveries(
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
