"""A team's webhooks, and the outbox: each delivery and each attempt to send it."""

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    Index,
    String,
    Text,
)
from sqlmodel import Field, SQLModel

from app.core.tables import NEVER_REUSED, optional_timestamp, timestamp
from app.webhooks.schemas import DeliveryStatus


class Webhook(SQLModel, table=True):
    """A team's subscription. The secret signs deliveries, so it is kept (shown once),
    encrypted (app/core/encryption.py)."""

    __tablename__ = "webhooks"
    __table_args__ = (Index("ix_webhooks_team_id", "team_id"), NEVER_REUSED)

    id: int | None = Field(default=None, primary_key=True)
    team_id: int = Field(foreign_key="teams.id")
    url: str = Field(sa_type=Text)
    events: list[str] = Field(sa_type=JSON)
    description: str | None = Field(default=None, sa_type=Text)
    secret: str = Field(sa_type=Text)
    created_at: datetime = timestamp()
    deleted_at: datetime | None = optional_timestamp()


class WebhookDelivery(SQLModel, table=True):
    """The outbox: one event for one webhook, written in the transaction of the job's change
    and sent by the workers until it is delivered or its retry window ends."""

    __tablename__ = "webhook_deliveries"
    __table_args__ = (
        Index("ix_webhook_deliveries_status_next_attempt_at", "status", "next_attempt_at"),
        Index("ix_webhook_deliveries_webhook_id_id", "webhook_id", "id"),
        NEVER_REUSED,
    )

    id: int | None = Field(default=None, primary_key=True)
    webhook_id: int = Field(foreign_key="webhooks.id", ondelete="CASCADE")
    job_id: int | None = Field(default=None, foreign_key="jobs.id", ondelete="CASCADE")
    event: str = Field(sa_type=String(32))
    message_id: str = Field(sa_type=String(64), unique=True)
    payload: dict[str, Any] = Field(sa_type=JSON)
    status: str = Field(default=DeliveryStatus.pending, sa_type=String(16))
    attempts: int = 0
    created_at: datetime = timestamp()
    next_attempt_at: datetime = timestamp()
    retry_until: datetime = timestamp()
    lease_until: datetime | None = optional_timestamp()
    delivered_at: datetime | None = optional_timestamp()
    last_status_code: int | None = None
    last_error: str | None = Field(default=None, sa_type=Text)


class WebhookAttempt(SQLModel, table=True):
    """One try at sending a delivery, as it went."""

    __tablename__ = "webhook_attempts"
    __table_args__ = (Index("ix_webhook_attempts_delivery_id_id", "delivery_id", "id"),)

    id: int | None = Field(default=None, primary_key=True)
    delivery_id: int = Field(foreign_key="webhook_deliveries.id", ondelete="CASCADE")
    attempted_at: datetime = timestamp()
    worker_id: str = Field(sa_type=String(200))
    status_code: int | None = None
    error: str | None = Field(default=None, sa_type=Text)
    duration_ms: float
