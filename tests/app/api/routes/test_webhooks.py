"""/v1/webhooks: a team's subscriptions, the secret shown once, deliveries and their
attempts, re-sending, and URLs the service must not call refused at the door."""

from __future__ import annotations

import pytest
from sqlalchemy import select
from standardwebhooks import Webhook as Signer

from app.webhooks.store import Outcome, record_attempt
from app.webhooks.tables import Webhook
from tests.app.conftest import auth

EVENTS = ["job.succeeded", "job.cancelled"]
URL = "https://hooks.example.com/opd"


async def make_hook(client, key, **body) -> dict:
    response = await client.post(
        "/v1/webhooks", json={"url": URL, "events": EVENTS} | body, headers=auth(key)
    )
    assert response.status_code == 201, response.text
    return response.json()


async def test_the_secret_is_shown_once_and_signs(client, key):
    created = await make_hook(client, key, description="ci")

    assert created["secret"].startswith("whsec_")
    Signer(created["secret"])  # a valid Standard Webhooks secret
    listed = (await client.get("/v1/webhooks", headers=auth(key))).json()["data"]
    read = (await client.get(f"/v1/webhooks/{created['id']}", headers=auth(key))).json()
    assert [hook["id"] for hook in listed] == [created["id"]]
    assert "secret" not in listed[0] and "secret" not in read
    assert read["events"] == EVENTS and read["description"] == "ci"


async def test_the_secret_is_stored_encrypted(client, key, session, box):
    created = await make_hook(client, key)
    stored = await session.execute(select(Webhook.secret).where(Webhook.id == created["id"]))
    sealed = stored.scalar_one()
    assert created["secret"] not in sealed and not sealed.startswith("whsec_")
    assert box.open(sealed) == created["secret"]


async def test_a_cancel_makes_a_delivery_that_can_be_read_and_resent(client, key, submit, sessions):
    hook = await make_hook(client, key)
    job = await submit()
    await client.post(f"/v1/jobs/{job['id']}/cancel", headers=auth(key))

    (delivery,) = (
        await client.get(f"/v1/webhooks/{hook['id']}/deliveries", headers=auth(key))
    ).json()["data"]
    assert (delivery["event"], delivery["job_id"], delivery["status"]) == (
        "job.cancelled",
        job["id"],
        "pending",
    )
    async with sessions() as session:
        await record_attempt(session, delivery["id"], "w", Outcome(500, "boom", 9.0), (1, 10))
    path = f"/v1/webhooks/{hook['id']}/deliveries/{delivery['id']}"
    detail = (await client.get(path, headers=auth(key))).json()
    assert [(a["status_code"], a["error"]) for a in detail["attempt_log"]] == [(500, "boom")]

    resent = await client.post(f"{path}/resend", headers=auth(key))
    assert resent.status_code == 202
    assert resent.json()["status"] == "pending"
    assert resent.json()["message_id"] == delivery["message_id"]


async def test_another_teams_webhook_is_a_404_and_a_deleted_one_is_gone(client, key, make_key):
    hook = await make_hook(client, key)
    other = await make_key()
    assert (await client.get(f"/v1/webhooks/{hook['id']}", headers=auth(other))).status_code == 404
    assert (
        await client.delete(f"/v1/webhooks/{hook['id']}", headers=auth(other))
    ).status_code == 404

    assert (await client.delete(f"/v1/webhooks/{hook['id']}", headers=auth(key))).status_code == 204
    assert (await client.get(f"/v1/webhooks/{hook['id']}", headers=auth(key))).status_code == 404
    assert (await client.get("/v1/webhooks", headers=auth(key))).json()["data"] == []


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"url": "http://169.254.169.254/latest"}, "link-local address"),
        ({"url": "http://127.0.0.1:8000/hook"}, "loopback address"),
        # Other spellings of 127.0.0.1 the resolver reads: refused now, not at delivery.
        ({"url": "http://0x7f000001:8000/hook"}, "loopback address"),
        ({"url": "http://2130706433/hook"}, "loopback address"),
        ({"url": "http://127.1/hook"}, "loopback address"),
        ({"url": "http://0177.0.0.1/hook"}, "loopback address"),
        ({"url": "file:///etc/passwd"}, "http:// or https://"),
        ({"events": ["job.exploded"]}, "events.0"),
        ({"events": []}, "events"),
    ],
)
async def test_bad_webhooks_are_a_422(client, key, body, message):
    response = await client.post(
        "/v1/webhooks", json={"url": URL, "events": EVENTS} | body, headers=auth(key)
    )
    assert response.status_code == 422
    assert message in response.json()["error"]["message"]
