"""The webhook outbox: deliveries written with the job's change, leased by one sender at a
time, retried with exponential backoff until delivered or past their window."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from sqlalchemy import select

from app.core.tables import utcnow
from app.jobs.schemas import JobAction
from app.jobs.store import apply_action, claim_job, complete_job
from app.records.store import record_eval
from app.webhooks.schemas import DeliveryStatus
from app.webhooks.store import (
    Outcome,
    create_webhook,
    delete_webhook,
    record_attempt,
    resend,
    retry_delay,
    take_due,
)
from app.webhooks.tables import WebhookAttempt, WebhookDelivery

ALL = ["job.succeeded", "job.failed", "job.cancelled", "job.paused", "job.eval_completed"]


async def deliveries(session, job_id: int) -> list[WebhookDelivery]:
    rows = await session.execute(
        select(WebhookDelivery)
        .where(WebhookDelivery.job_id == job_id)
        .order_by(WebhookDelivery.id)
        .execution_options(populate_existing=True)
    )
    return list(rows.scalars())


async def test_a_transition_writes_one_delivery_per_subscribed_webhook(session, job, make_key, box):
    everything = await create_webhook(session, box, job.team_id, "https://a.example/h", ALL, None)
    await create_webhook(session, box, job.team_id, "https://b.example/h", ["job.failed"], None)
    gone = await create_webhook(session, box, job.team_id, "https://c.example/h", ALL, None)
    await delete_webhook(session, gone.id, job.team_id)
    other = await make_key()
    await create_webhook(session, box, other.team.id, "https://d.example/h", ALL, None)

    await apply_action(session, job.id, JobAction.cancel)

    (delivery,) = await deliveries(session, job.id)
    assert (delivery.webhook_id, delivery.event, delivery.status) == (
        everything.id,
        "job.cancelled",
        DeliveryStatus.pending,
    )
    assert delivery.message_id.startswith("msg_")
    assert delivery.payload["type"] == "job.cancelled"
    assert (
        delivery.payload["data"] | {"job_id": job.id, "status": "cancelled"}
        == delivery.payload["data"]
    )
    assert delivery.retry_until - delivery.created_at == timedelta(hours=24)


async def test_success_and_the_final_eval_are_announced_once(session, job, box):
    await create_webhook(session, box, job.team_id, "https://a.example/h", ALL, None)
    await claim_job(session, job.id, "w1", heartbeat_timeout=60)
    await record_eval(session, job.id, "w1", 3, {"eval/accuracy": 0.5, "time/eval": 1.0})
    await record_eval(session, job.id, "w1", 3, {"eval/accuracy": 0.5})  # replayed
    await complete_job(session, job.id, "w1", f"/weights/job-{job.id}/final")

    events = [(d.event, d.payload["data"]) for d in await deliveries(session, job.id)]

    assert [event for event, _ in events] == ["job.eval_completed", "job.succeeded"]
    assert events[0][1]["metrics"] == {"eval/accuracy": 0.5}
    assert events[1][1]["final_weights_path"] == f"job-{job.id}/final"  # never the folder


async def test_racing_senders_never_take_the_same_delivery(sessions, session, job, box):
    await create_webhook(session, box, job.team_id, "https://a.example/h", ALL, None)
    await apply_action(session, job.id, JobAction.cancel)
    (mine,) = await deliveries(session, job.id)

    async def take() -> list[int]:
        async with sessions() as own:
            return [d.id for d in await take_due(own, 30, 1000, team_limit=1000)]

    taken = await asyncio.gather(*(take() for _ in range(4)))

    assert sum(batch.count(mine.id) for batch in taken) == 1
    later = utcnow() + timedelta(seconds=31)  # the lease ran out: a sender died
    assert mine.id in [d.id for d in await take_due(session, 30, 1000, team_limit=1000, now=later)]


async def test_failures_back_off_exponentially_then_give_up(session, job, box):
    await create_webhook(session, box, job.team_id, "https://a.example/h", ALL, None)
    await apply_action(session, job.id, JobAction.cancel)
    (delivery,) = await deliveries(session, job.id)
    backoff = (5.0, 60.0)

    waits = []
    for _ in range(3):
        before = utcnow()
        status = await record_attempt(
            session, delivery.id, "w", Outcome(503, "down", 12.0), backoff
        )
        (delivery,) = await deliveries(session, job.id)
        waits.append(round((delivery.next_attempt_at - before).total_seconds()))
        assert status is DeliveryStatus.pending
    assert waits == [5, 10, 20]
    assert [retry_delay(n, *backoff) for n in (4, 5, 6)] == [40, 60, 60]

    delivery.retry_until = utcnow() + timedelta(seconds=30)
    await session.commit()
    gave_up = await record_attempt(
        session, delivery.id, "w", Outcome(None, "timeout", 1.0), backoff
    )
    assert gave_up is DeliveryStatus.failed

    await resend(session, delivery.webhook_id, delivery.id)
    delivered = await record_attempt(session, delivery.id, "w", Outcome(204, None, 3.0), backoff)
    assert delivered is DeliveryStatus.delivered
    attempts = await session.execute(
        select(WebhookAttempt.status_code).where(WebhookAttempt.delivery_id == delivery.id)
    )
    assert list(attempts.scalars()) == [503, 503, 503, None, 204]
