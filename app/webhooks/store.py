"""Webhooks: a team's subscriptions, and the outbox's deliveries as the workers send them.

Sending is at least once: a worker takes a due delivery with a lease (`lease_until`); if it
dies mid-send, the lease runs out and another worker sends it again, with the same
`webhook-id`, so the receiver can drop the repeat.
"""

from __future__ import annotations

import base64
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, or_, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from app.core.db import commit_or_flush, detach
from app.core.encryption import SecretBox, SecretUnreadable
from app.core.tables import utcnow
from app.webhooks.outbox import RETRY_FOR
from app.webhooks.schemas import DeliveryStatus
from app.webhooks.tables import Webhook, WebhookAttempt, WebhookDelivery

SECRET_BYTES = 32


class WebhookNotFound(LookupError):
    """No such webhook or delivery (or another team's)."""


def new_secret() -> str:
    """A Standard Webhooks signing secret: `whsec_` and base64 of random bytes."""
    return "whsec_" + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode()


async def create_webhook(
    session: AsyncSession,
    box: SecretBox,
    team_id: int,
    url: str,
    events: list[str],
    description: str | None,
    *,
    commit: bool = True,
) -> Webhook:
    """The new webhook; its signing secret is kept encrypted (`box.open` it to show it;
    commit=False: the caller commits)."""
    webhook = Webhook(
        team_id=team_id,
        url=url,
        events=events,
        description=description,
        secret=box.seal(new_secret()),
        created_at=utcnow(),
    )
    session.add(webhook)
    await commit_or_flush(session, commit)
    return detach(session, webhook)


async def reseal_secrets(session: AsyncSession, box: SecretBox) -> int:
    """Encrypt every stored signing secret under the box's first key (after a new key was
    put first in OPD_SECRET_KEY, so that the old one can be dropped); returns how many."""
    rows = (await session.execute(select(Webhook.id, Webhook.secret))).all()
    for webhook_id, sealed in rows:
        try:
            resealed = box.reseal(sealed)
        except SecretUnreadable:
            await session.rollback()
            raise SecretUnreadable(
                f"webhook {webhook_id}'s secret opens under none of the keys; nothing was changed"
            ) from None
        await session.execute(
            update(Webhook).where(Webhook.id == webhook_id).values(secret=resealed)
        )
    await session.commit()
    return len(rows)


def visible(team_id: int | None) -> Any:
    live = Webhook.deleted_at.is_(None)
    return live if team_id is None else live & (Webhook.team_id == team_id)


async def list_webhooks(session: AsyncSession, team_id: int | None) -> list[Webhook]:
    rows = await session.execute(select(Webhook).where(visible(team_id)).order_by(Webhook.id))
    return [detach(session, webhook) for webhook in rows.scalars()]


async def get_webhook(session: AsyncSession, webhook_id: int, team_id: int | None) -> Webhook:
    query = select(Webhook).where(Webhook.id == webhook_id, visible(team_id))
    webhook = (await session.execute(query)).scalar_one_or_none()
    if webhook is None:
        raise WebhookNotFound(f"webhook {webhook_id} not found")
    return detach(session, webhook)


async def delete_webhook(
    session: AsyncSession, webhook_id: int, team_id: int | None, *, commit: bool = True
) -> None:
    """Stop the webhook: nothing more is sent to it, its pending deliveries are given up;
    its deliveries stay readable (commit=False: the caller commits)."""
    webhook = await get_webhook(session, webhook_id, team_id)
    now = utcnow()
    await session.execute(update(Webhook).where(Webhook.id == webhook.id).values(deleted_at=now))
    await session.execute(
        update(WebhookDelivery)
        .where(
            WebhookDelivery.webhook_id == webhook.id,
            WebhookDelivery.status == DeliveryStatus.pending,
        )
        .values(status=DeliveryStatus.failed, last_error="the webhook was deleted")
    )
    await commit_or_flush(session, commit)


def deliveries_query(webhook_id: int, after: int | None) -> Any:
    query = (
        select(WebhookDelivery)
        .where(WebhookDelivery.webhook_id == webhook_id)
        .order_by(WebhookDelivery.id.desc())
    )
    return query if after is None else query.where(WebhookDelivery.id < after)


async def get_delivery(
    session: AsyncSession, webhook_id: int, delivery_id: int
) -> tuple[WebhookDelivery, list[WebhookAttempt]]:
    delivery = (
        await session.execute(
            select(WebhookDelivery)
            .where(WebhookDelivery.id == delivery_id, WebhookDelivery.webhook_id == webhook_id)
            .execution_options(populate_existing=True)
        )
    ).scalar_one_or_none()
    if delivery is None:
        raise WebhookNotFound(f"delivery {delivery_id} of webhook {webhook_id} not found")
    attempts = await session.execute(
        select(WebhookAttempt)
        .where(WebhookAttempt.delivery_id == delivery_id)
        .order_by(WebhookAttempt.id)
    )
    return detach(session, delivery), [detach(session, a) for a in attempts.scalars()]


async def resend(
    session: AsyncSession, webhook_id: int, delivery_id: int, *, commit: bool = True
) -> None:
    """Send a delivery again now (same `webhook-id`), with a fresh retry window
    (commit=False: the caller commits)."""
    await get_delivery(session, webhook_id, delivery_id)
    now = utcnow()
    await session.execute(
        update(WebhookDelivery)
        .where(WebhookDelivery.id == delivery_id)
        .values(
            status=DeliveryStatus.pending,
            next_attempt_at=now,
            retry_until=now + RETRY_FOR,
            lease_until=None,
        )
    )
    await commit_or_flush(session, commit)


# --- the workers' side ------------------------------------------------------------------------


@dataclass(frozen=True)
class Outgoing:
    """A delivery a worker took, with what sending it needs (the webhook's signing secret
    still encrypted: `SecretBox.open` it to sign)."""

    id: int
    message_id: str
    payload: dict[str, Any]
    url: str
    sealed_secret: str
    team_id: int


async def take_due(
    session: AsyncSession,
    lease_seconds: float,
    limit: int,
    team_limit: int,
    sending: Mapping[int, int] | None = None,
    now: datetime | None = None,
) -> list[Outgoing]:
    """Lease up to `limit` due deliveries for `lease_seconds`, the longest due first, at
    most `team_limit` of one team less what the caller is `sending` of it already (team id:
    deliveries in flight): pending, due, and not leased by a live sender. One team's backlog
    then cannot take every place while another team's deliveries wait. The UPDATE re-checks
    the lease on each row it takes, so two workers never take one delivery at once."""
    now = now or utcnow()
    sending = sending or {}
    free = or_(WebhookDelivery.lease_until.is_(None), WebhookDelivery.lease_until < now)
    due = (WebhookDelivery.status == DeliveryStatus.pending) & (
        WebhookDelivery.next_attempt_at <= now
    )
    order = (WebhookDelivery.next_attempt_at, WebhookDelivery.id)
    in_team = func.row_number().over(partition_by=Webhook.team_id, order_by=order)
    ranked = (
        select(
            WebhookDelivery.id,
            WebhookDelivery.next_attempt_at,
            Webhook.team_id,
            in_team.label("rank"),
        )
        .join(Webhook, Webhook.id == WebhookDelivery.webhook_id)
        .where(due, free)
        .subquery()
    )
    # A team's rows past its room here are dropped below: at most as many as are in flight.
    candidates = await session.execute(
        select(ranked.c.id, ranked.c.team_id, ranked.c.rank)
        .where(ranked.c.rank <= team_limit)
        .order_by(ranked.c.next_attempt_at, ranked.c.id)
        .limit(limit + sum(sending.values()))
    )
    chosen = [
        delivery_id
        for delivery_id, team_id, rank in candidates
        if rank <= team_limit - sending.get(team_id, 0)
    ][:limit]
    if not chosen:
        await session.commit()
        return []
    taken = await session.execute(
        update(WebhookDelivery)
        .where(WebhookDelivery.id.in_(chosen), due, free)
        .values(lease_until=now + timedelta(seconds=lease_seconds))
        .returning(WebhookDelivery.id)
        .execution_options(synchronize_session=False)
    )
    ids = list(taken.scalars())
    await session.commit()
    if not ids:
        return []
    rows = await session.execute(
        select(
            WebhookDelivery.id,
            WebhookDelivery.message_id,
            WebhookDelivery.payload,
            Webhook.url,
            Webhook.secret,
            Webhook.team_id,
        )
        .join(Webhook, Webhook.id == WebhookDelivery.webhook_id)
        .where(WebhookDelivery.id.in_(ids))
        .order_by(WebhookDelivery.id)
    )
    return [Outgoing(*row) for row in rows]


def retry_delay(attempts: int, base: float, cap: float) -> float:
    """Seconds before attempt `attempts + 1`: `base` doubled after each failure, at most `cap`."""
    return min(cap, base * 2 ** (attempts - 1))


@dataclass(frozen=True)
class Outcome:
    """How one attempt went."""

    status_code: int | None
    error: str | None
    duration_ms: float

    @property
    def delivered(self) -> bool:
        return self.status_code is not None and 200 <= self.status_code < 300


async def record_attempt(
    session: AsyncSession,
    delivery_id: int,
    worker_id: str,
    outcome: Outcome,
    backoff: tuple[float, float],
) -> DeliveryStatus:
    """Record an attempt and what follows: delivered, the next try after the backoff
    (`backoff` = base and cap in seconds), or given up once past its retry window."""
    now = utcnow()
    session.add(
        WebhookAttempt(
            delivery_id=delivery_id,
            attempted_at=now,
            worker_id=worker_id,
            status_code=outcome.status_code,
            error=outcome.error,
            duration_ms=outcome.duration_ms,
        )
    )
    delivery = await session.get(WebhookDelivery, delivery_id, populate_existing=True)
    assert delivery is not None
    delivery.attempts += 1
    delivery.last_status_code = outcome.status_code
    delivery.last_error = outcome.error
    delivery.lease_until = None
    if outcome.delivered:
        delivery.status = DeliveryStatus.delivered
        delivery.delivered_at = now
    elif delivery.status == DeliveryStatus.pending:
        wait = timedelta(seconds=retry_delay(delivery.attempts, *backoff))
        if now + wait > delivery.retry_until:
            delivery.status = DeliveryStatus.failed
        else:
            delivery.next_attempt_at = now + wait
    status = DeliveryStatus(delivery.status)
    await session.commit()
    return status
