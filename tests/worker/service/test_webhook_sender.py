"""The webhook sender against a real database, read back through the API: what the team
sees of an attempt, and what the operator's log says."""

from __future__ import annotations

import logging

from app.store.webhooks import create_webhook
from tests.app.conftest import auth, serve, small_spec
from worker.service.webhooks import Sender

LOOPBACK = ("127.0.0.1", "::1")


async def test_a_refused_destination_shows_the_team_no_address(settings, sessions, key, caplog):
    # A name that resolved to a public address when the webhook was made may resolve to a
    # private one by the time an event is sent.
    async with sessions() as session:
        hook = await create_webhook(
            session, key.team.id, "http://localhost:9/hook", ["job.cancelled"], None
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
