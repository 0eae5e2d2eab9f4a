"""Webhooks of the caller's team (every team's for an admin key): subscribe a URL to job
events, read each delivery and its attempts, send one again. The signing secret is shown
once, when the webhook is created."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Response

from app.api.deps import MAX_ID, Cursor, PrincipalDep, SecretBoxDep, SessionDep, SettingsDep
from app.api.errors import ApiError, error_responses
from app.api.pagination import paginate
from app.audit.store import record_audit
from app.webhooks import store
from app.webhooks.schemas import (
    AttemptPublic,
    DeliveriesPage,
    DeliveryDetail,
    DeliveryPublic,
    WebhookCreate,
    WebhookCreated,
    WebhookPublic,
    WebhooksPage,
)
from app.webhooks.urls import UnsafeUrl, check_literal

router = APIRouter(
    prefix="/v1/webhooks",
    tags=["webhooks"],
    responses=error_responses(400, 401, 403, 413, 415, 422, 503),
)
WebhookId = Annotated[int, Path(ge=1, le=MAX_ID, description="The webhook's id.")]
DeliveryId = Annotated[int, Path(ge=1, le=MAX_ID, description="The delivery's id.")]
NOT_FOUND = error_responses(404)
MAX_PAGE = 100


@router.post("", status_code=201, response_model=WebhookCreated)
async def create_webhook(
    body: WebhookCreate,
    session: SessionDep,
    principal: PrincipalDep,
    settings: SettingsDep,
    box: SecretBoxDep,
) -> WebhookCreated:
    """Subscribe a URL to events of the team's jobs. Deliveries are signed per the
    Standard Webhooks spec with the returned secret (shown only here)."""
    try:
        check_literal(body.url, settings.webhook_allow_private)
    except UnsafeUrl as error:
        raise ApiError(422, "invalid_request", f"url: {error}", "url") from None
    events = [event.value for event in dict.fromkeys(body.events)]
    webhook = await store.create_webhook(
        session, box, principal.team_id, body.url, events, body.description, commit=False
    )
    detail = {"url": body.url, "events": events}
    await record_audit(session, principal, "webhook.create", f"webhook {webhook.id}", 201, detail)
    public = WebhookPublic.model_validate(webhook).model_dump()
    return WebhookCreated(**public, secret=box.open(webhook.secret))


@router.get("", response_model=WebhooksPage)
async def list_webhooks(session: SessionDep, principal: PrincipalDep) -> WebhooksPage:
    """The team's webhooks (every team's for an admin key), oldest first; no secrets."""
    hooks = await store.list_webhooks(session, principal.scope)
    return WebhooksPage(data=[WebhookPublic.model_validate(hook) for hook in hooks])


@router.get("/{webhook_id}", response_model=WebhookPublic, responses=NOT_FOUND)
async def read_webhook(
    webhook_id: WebhookId, session: SessionDep, principal: PrincipalDep
) -> WebhookPublic:
    return WebhookPublic.model_validate(
        await store.get_webhook(session, webhook_id, principal.scope)
    )


@router.delete("/{webhook_id}", status_code=204, responses=NOT_FOUND)
async def delete_webhook(
    webhook_id: WebhookId, session: SessionDep, principal: PrincipalDep
) -> Response:
    """Nothing more is sent to it; its pending deliveries are given up."""
    await store.delete_webhook(session, webhook_id, principal.scope, commit=False)
    await record_audit(session, principal, "webhook.delete", f"webhook {webhook_id}", 204)
    return Response(status_code=204)


@router.get("/{webhook_id}/deliveries", response_model=DeliveriesPage, responses=NOT_FOUND)
async def list_deliveries(
    webhook_id: WebhookId,
    session: SessionDep,
    principal: PrincipalDep,
    after: Cursor = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 20,
) -> DeliveriesPage:
    """Newest first: each event sent (or being sent) to the webhook and how it went."""
    await store.get_webhook(session, webhook_id, principal.scope)
    return await paginate(session, store.deliveries_query(webhook_id, after), limit, DeliveriesPage)


@router.get(
    "/{webhook_id}/deliveries/{delivery_id}", response_model=DeliveryDetail, responses=NOT_FOUND
)
async def read_delivery(
    webhook_id: WebhookId, delivery_id: DeliveryId, session: SessionDep, principal: PrincipalDep
) -> DeliveryDetail:
    """A delivery with every attempt: when, the receiver's status, the error, how long."""
    await store.get_webhook(session, webhook_id, principal.scope)
    delivery, attempts = await store.get_delivery(session, webhook_id, delivery_id)
    return DeliveryDetail.model_validate(
        {
            **DeliveryPublic.model_validate(delivery).model_dump(),
            "attempt_log": [AttemptPublic.model_validate(a) for a in attempts],
        }
    )


@router.post(
    "/{webhook_id}/deliveries/{delivery_id}/resend",
    status_code=202,
    response_model=DeliveryPublic,
    responses=NOT_FOUND,
)
async def resend_delivery(
    webhook_id: WebhookId, delivery_id: DeliveryId, session: SessionDep, principal: PrincipalDep
) -> DeliveryPublic:
    """Send the delivery again soon (same `webhook-id`), retrying for another 24 h."""
    await store.get_webhook(session, webhook_id, principal.scope)
    await store.resend(session, webhook_id, delivery_id, commit=False)
    target = f"webhook {webhook_id} delivery {delivery_id}"
    await record_audit(session, principal, "webhook.resend", target, 202)
    delivery, _ = await store.get_delivery(session, webhook_id, delivery_id)
    return DeliveryPublic.model_validate(delivery)
