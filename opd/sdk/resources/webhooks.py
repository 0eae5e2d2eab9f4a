"""Webhooks: subscriptions and their deliveries."""

from __future__ import annotations

from collections.abc import Sequence

from app.webhooks.schemas import (
    DeliveriesPage,
    DeliveryDetail,
    DeliveryPublic,
    WebhookCreated,
    WebhookEvent,
    WebhookPublic,
    WebhooksPage,
)
from opd.sdk.resources.base import Resource, X, listed, operation, query
from opd.sdk.transport import Call, Listing, Steps, fetch


class Webhooks(Resource[X]):
    """The team's webhooks and what was delivered to them."""

    @operation
    def create(
        self, url: str, events: Sequence[WebhookEvent | str], *, description: str | None = None
    ) -> Steps[WebhookCreated]:
        """Subscribe `url`; `.secret` (shown only here) verifies the signatures."""
        body = query(url=url, events=list(events), description=description)
        return (
            yield from fetch(
                Call("POST", "/v1/webhooks", json=body, resendable=False), WebhookCreated
            )
        )

    @listed(WebhookPublic)
    def list(self) -> Listing:
        return Listing(Call("GET", "/v1/webhooks"), WebhooksPage)

    @operation
    def get(self, webhook_id: int) -> Steps[WebhookPublic]:
        return (yield from fetch(Call("GET", f"/v1/webhooks/{webhook_id}"), WebhookPublic))

    @operation
    def delete(self, webhook_id: int) -> Steps[None]:
        yield Call("DELETE", f"/v1/webhooks/{webhook_id}")

    @listed(DeliveryPublic)
    def deliveries(self, webhook_id: int, *, page_size: int = 100) -> Listing:
        """Each event sent (or being sent) to the webhook, newest first."""
        return Listing(
            Call("GET", f"/v1/webhooks/{webhook_id}/deliveries", params={"limit": page_size}),
            DeliveriesPage,
        )

    @operation
    def delivery(self, webhook_id: int, delivery_id: int) -> Steps[DeliveryDetail]:
        path = f"/v1/webhooks/{webhook_id}/deliveries/{delivery_id}"
        return (yield from fetch(Call("GET", path), DeliveryDetail))

    @operation
    def resend(self, webhook_id: int, delivery_id: int) -> Steps[DeliveryPublic]:
        path = f"/v1/webhooks/{webhook_id}/deliveries/{delivery_id}/resend"
        return (yield from fetch(Call("POST", path), DeliveryPublic))
