"""The webhook sender against a real database, read back through the API: what the team
sees of an attempt, what the operator's log says, and that neither a huge answer nor one
team's slow receivers take more than their share of a worker (real receivers, over real
sockets)."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter

import httpx
from cryptography.fernet import Fernet
from pydantic import SecretStr
from sqlalchemy import select

from app.webhooks.store import create_webhook
from app.webhooks.tables import WebhookDelivery
from tests.app.conftest import auth, serve, small_spec
from tests.e2e.receiver import Receiver, Server, wait_for
from worker.service.webhooks import Sender

LOOPBACK = ("127.0.0.1", "::1")
HUGE = 256 * 1024 * 1024
"""An answer no sender should read (a receiver answering 1 GB grew a worker by 2 GB)."""
READ_BOUND = 32 * 1024 * 1024
"""Far above what the sender reads (a few KB and one socket read); what the receiver gets
out before its connection is closed also fills both sides' socket buffers."""


async def send_all_due(sender: Sender) -> int:
    """Start the due sends and wait for them to end; how many there were."""
    sent = await sender.send_due()
    await asyncio.gather(*sent)
    return len(sent)


async def until(condition, what: str) -> None:
    """Wait, letting the sends run, for `condition` (a receiver thread's state) to hold."""
    await asyncio.to_thread(wait_for, condition, 10, what)


async def cancelled_jobs(client: httpx.AsyncClient, key, count: int) -> None:
    for _ in range(count):
        job = (await client.post("/v1/jobs", json=small_spec(), headers=auth(key))).json()
        await client.post(f"/v1/jobs/{job['id']}/cancel", headers=auth(key))


async def subscribe(client: httpx.AsyncClient, key, receiver: Receiver, server: Server) -> int:
    """A webhook of `key`'s team sending its jobs' cancellations to `receiver`."""
    body = {"url": server.url, "events": ["job.cancelled"]}
    hook = (await client.post("/v1/webhooks", json=body, headers=auth(key))).json()
    receiver.secret = hook["secret"]
    return hook["id"]


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
            assert await send_all_due(sender) == 1
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
    receiver = Receiver()  # it verifies each signature with the secret the team was shown
    with Server(receiver) as server:
        async with serve(settings) as client:
            await subscribe(client, key, receiver, server)
            await cancelled_jobs(client, key, 1)
        sender = Sender(sessions, settings, "w")
        assert await send_all_due(sender) == 1
        await sender.close()
    (arrival,) = receiver.of_type("job.cancelled")
    assert receiver.rejected == 0 and arrival.payload["data"]["status"] == "cancelled"


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
        assert await send_all_due(sender) == 1
    await sender.close()
    async with sessions() as session:
        (delivery,) = (
            await session.execute(
                select(WebhookDelivery).where(WebhookDelivery.job_id == job["id"])
            )
        ).scalars()
    assert delivery.last_error == "the service cannot sign this delivery (its operator is told why)"
    assert "OPD_SECRET_KEY" in caplog.text


async def test_a_huge_answer_is_cut_off_and_the_delivery_counts(settings, sessions, key):
    settings = settings.model_copy(update={"webhook_allow_private": True})
    receiver = Receiver(answer_bytes=HUGE)
    with Server(receiver) as server:
        async with serve(settings) as client:
            hook_id = await subscribe(client, key, receiver, server)
            await cancelled_jobs(client, key, 1)
            sender = Sender(sessions, settings, "w")
            assert await send_all_due(sender) == 1
            await sender.close()
            path = f"/v1/webhooks/{hook_id}/deliveries"
            (delivery,) = (await client.get(path, headers=auth(key))).json()["data"]
        await until(lambda: receiver.answered, "the receiver's answer to end")
    (written,) = receiver.answered
    assert written < READ_BOUND, f"the receiver got {written} bytes out: the sender read them"
    assert (delivery["status"], delivery["last_status_code"]) == ("delivered", 200)


async def test_one_teams_slow_receivers_leave_the_other_teams_places(
    settings, sessions, key, make_key
):
    settings = settings.model_copy(
        update={
            "webhook_allow_private": True,
            "webhook_concurrency": 3,
            "webhook_team_concurrency": 2,
        }
    )
    other = await make_key()
    slow, quick = Receiver(hold_all=True), Receiver()
    with Server(slow) as slow_server, Server(quick) as quick_server:
        async with serve(settings) as client:
            await subscribe(client, key, slow, slow_server)
            await subscribe(client, other, quick, quick_server)
            await cancelled_jobs(client, key, 4)  # due first
            await cancelled_jobs(client, other, 2)
        sender = Sender(sessions, settings, "w")
        started = await sender.send_due()
        team_of = {task: sender.sending[task] for task in started}
        assert Counter(team_of.values()) == {key.team.id: 2, other.team.id: 1}
        await until(lambda: slow.holding == 2, "the slow receiver to hold two requests")
        await asyncio.gather(*(t for t in started if team_of[t] == other.team.id))
        (next_one,) = await sender.send_due()
        assert sender.sending[next_one] == other.team.id, "the freed place is the other team's"
        await next_one
        assert len(quick.delivered) == 2 and slow.holding == 2
        assert await sender.send_due() == [], "the slow team has all the places it may"
        slow.release.set()
        await sender.close()
