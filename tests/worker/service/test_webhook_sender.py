"""The webhook sender against a real database, read back through the API: what the team
sees of an attempt, and what the operator's log says."""

from __future__ import annotations

import logging

import httpx
from cryptography.fernet import Fernet
from pydantic import SecretStr
from sqlalchemy import select
from standardwebhooks import Webhook as Signer

from app.models import WebhookDelivery
from app.store.webhooks import create_webhook
from tests.app.conftest import auth, serve, small_spec
from worker.service.webhooks import Sender

LOOPBACK = ("127.0.0.1", "::1")


async def test_a_refused_destination_shows_the_team_no_address(
    settings, sessions, key, box, caplog
):
    # A name that resolved to a public address when the webhook was made may resolve to a
    # private one by the time an event is sent.
    async with sessions() as session:
        hook = await create_webhook(
            session, box, key.team.id, "http://localhost:9/hook", ["job.cancelled"], None
        )
    async with serve(settings) as client:
        job = (await client.post("/v1/jobs", json=small_spec(), headers=auth(key))).json()
        await client.post(f"/v1/jobs/{job['id']}/cancel", headers=auth(key))
        sender = Sender(sessions, settings, "w")
        with caplog.at_level(logging.WARNING, logger="worker.service.webhooks"):
            assert await sender.send_due() == 1
        await sender.close()
        path = f"/v1/webhooks/{hook.id}/deliveries"
        (delivery,) = (await client.get(path, headers=auth(key))).json()["data"]
        detail = (await client.get(f"{path}/{delivery['id']}", headers=auth(key))).json()
    (attempt,) = detail["attempt_log"]
    assert attempt["error"].startswith("the destination was refused")
    for shown in (attempt["error"], detail["last_error"]):
        assert not any(address in shown for address in LOOPBACK), shown
    assert any(address in caplog.text for address in LOOPBACK), "the operator's log has it"


async def test_deliveries_are_signed_with_the_secret_the_team_was_shown(settings, sessions, key):
    settings = settings.model_copy(update={"webhook_allow_private": True})
    received: list[httpx.Request] = []

    def receive(request: httpx.Request) -> httpx.Response:
        received.append(request)
        return httpx.Response(204)

    async with serve(settings) as client:
        body = {"url": "http://localhost:9/hook", "events": ["job.cancelled"]}
        created = (await client.post("/v1/webhooks", json=body, headers=auth(key))).json()
        job = (await client.post("/v1/jobs", json=small_spec(), headers=auth(key))).json()
        await client.post(f"/v1/jobs/{job['id']}/cancel", headers=auth(key))
    sender = Sender(sessions, settings, "w")
    sender.http = httpx.AsyncClient(transport=httpx.MockTransport(receive))
    assert await sender.send_due() == 1
    await sender.close()
    (request,) = received
    payload = Signer(created["secret"]).verify(request.content, dict(request.headers))
    assert payload["data"]["job_id"] == job["id"]


async def test_a_secret_no_key_opens_fails_the_attempt_without_saying_more(
    settings, sessions, key, box, caplog
):
    async with sessions() as session:
        hook = ("http://localhost:9/h", ["job.cancelled"], None)
        await create_webhook(session, box, key.team.id, *hook)
    async with serve(settings) as client:
        job = (await client.post("/v1/jobs", json=small_spec(), headers=auth(key))).json()
        await client.post(f"/v1/jobs/{job['id']}/cancel", headers=auth(key))
    # The key that sealed the secret was dropped from OPD_SECRET_KEY.
    rekeyed = settings.model_copy(update={"secret_key": SecretStr(Fernet.generate_key().decode())})
    sender = Sender(sessions, rekeyed, "w")
    with caplog.at_level(logging.ERROR, logger="worker.service.webhooks"):
        assert await sender.send_due() == 1
    await sender.close()
    async with sessions() as session:
        (delivery,) = (
            await session.execute(
                select(WebhookDelivery).where(WebhookDelivery.job_id == job["id"])
            )
        ).scalars()
    assert delivery.last_error == "the service cannot sign this delivery (its operator is told why)"
    assert "OPD_SECRET_KEY" in caplog.text
