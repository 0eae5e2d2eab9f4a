"""Webhooks, their deliveries and attempts as the API shows them, and the events a team can
subscribe to."""

from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from app.core.pages import Page
from app.webhooks.urls import URL_PATTERN
from kernel.json_types import JsonModel


class WebhookEvent(StrEnum):
    succeeded = "job.succeeded"
    failed = "job.failed"
    cancelled = "job.cancelled"
    paused = "job.paused"
    eval_completed = "job.eval_completed"
    sweep_completed = "sweep.completed"
    budget_threshold = "budget.threshold"


class DeliveryStatus(StrEnum):
    pending = "pending"
    delivered = "delivered"
    failed = "failed"


class WebhookCreate(JsonModel):
    model_config = ConfigDict(extra="forbid")

    url: str = Field(
        min_length=8,
        max_length=2000,
        json_schema_extra={"pattern": URL_PATTERN},
        description="http(s) URL that receives the events: a host (not a private address "
        "unless OPD_WEBHOOK_ALLOW_PRIVATE), an optional port, no credentials.",
    )
    events: list[WebhookEvent] = Field(min_length=1, max_length=len(WebhookEvent))
    description: str | None = Field(None, max_length=500)


class WebhookPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    team_id: int
    url: str
    events: list[WebhookEvent]
    description: str | None
    created_at: datetime


class WebhookCreated(WebhookPublic):
    secret: str = Field(
        description="The signing secret (`whsec_...`), shown only in this answer: keep it."
    )


class WebhooksPage(Page[WebhookPublic]):
    """Oldest first."""


class AttemptPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    attempted_at: datetime
    status_code: int | None = Field(description="The receiver's answer; null: none came.")
    error: str | None
    duration_ms: float


class DeliveryPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    job_id: int | None
    event: WebhookEvent
    message_id: str = Field(description="The `webhook-id` header: the same on every attempt.")
    status: DeliveryStatus
    attempts: int
    created_at: datetime
    next_attempt_at: datetime
    retry_until: datetime = Field(description="Failed attempts are retried until then.")
    delivered_at: datetime | None
    last_status_code: int | None
    last_error: str | None
    payload: dict[str, Any]


class DeliveriesPage(Page[DeliveryPublic]):
    """Newest first; pass `next_cursor` as `after` to get the next page."""


class DeliveryDetail(DeliveryPublic):
    attempt_log: list[AttemptPublic] = Field(description="Every attempt, oldest first.")
