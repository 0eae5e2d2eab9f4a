"""Signed webhooks with real processes and a real receiver that verifies every signature:
a job's terminal event arrives once, a receiver that fails three times then recovers gets
its event, and a worker killed in the middle of a delivery does not lose it.

`pytest tests/e2e/test_webhooks.py -s` prints each event's latency from the job's change
to the receiver."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import Service, deployment, tiny_spec
from tests.e2e.receiver import Receiver, Server, wait_for

EVENTS = ["job.succeeded", "job.failed", "job.cancelled", "job.paused", "job.eval_completed"]
TIMEOUT_SECONDS = 2  # the sender's limit per attempt; its lease is this + 5 s


@pytest.fixture
def receiver() -> Iterator[tuple[Receiver, Server]]:
    state = Receiver()
    with Server(state) as server:
        yield state, server


@pytest.fixture
def service(tmp_path: Path, database_url: str) -> Iterator[Service]:
    with deployment(
        tmp_path,
        database_url,
        webhook_allow_private="true",
        webhook_backoff_seconds="0.2",
        webhook_timeout=str(TIMEOUT_SECONDS),
        webhook_poll_interval="0.2",
    ) as running:
        yield running


def call(service: Service, method: str, path: str, **options) -> httpx.Response:
    headers = {"Authorization": f"Bearer {service.key}"}
    return httpx.request(method, f"{service.url}{path}", headers=headers, timeout=30, **options)


def cancelled_while_queued(service: Service) -> dict:
    job = service.submit(tiny_spec())
    return call(service, "POST", f"/v1/jobs/{job['id']}/cancel").json()


def latency(receipt: float, changed_at: str) -> float:
    return receipt - datetime.fromisoformat(changed_at.replace("Z", "+00:00")).timestamp()


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
def test_events_arrive_once_signed_through_failures_and_a_killed_worker(service, receiver):
    state, server = receiver
    hook = call(service, "POST", "/v1/webhooks", json={"url": server.url, "events": EVENTS})
    assert hook.status_code == 201, hook.text
    state.secret = hook.json()["secret"]
    hook_id = hook.json()["id"]

    # A receiver that fails three times, then recovers.
    state.fail_next = 3
    flaky = cancelled_while_queued(service)
    worker = service.start_worker()
    wait_for(lambda: state.of_type("job.cancelled"), 60, "the cancelled event")
    (first,) = state.of_type("job.cancelled")
    assert first.payload["data"]["job_id"] == flaky["id"]
    assert state.times_seen(first.message_id) == 4
    (delivery,) = call(service, "GET", f"/v1/webhooks/{hook_id}/deliveries").json()["data"]
    detail = call(service, "GET", f"/v1/webhooks/{hook_id}/deliveries/{delivery['id']}").json()
    assert [a["status_code"] for a in detail["attempt_log"]] == [500, 500, 500, 204]
    assert detail["status"] == "delivered"

    # A job's terminal event, once.
    job = service.submit(tiny_spec(steps=3))
    done = service.wait(job["id"])
    wait_for(lambda: state.of_type("job.succeeded"), 30, "the succeeded event")
    (succeeded,) = state.of_type("job.succeeded")
    assert succeeded.payload["data"]["final_weights_path"] == done["final_weights_path"]
    assert state.times_seen(succeeded.message_id) == 1
    print(f"\njob.succeeded arrived {latency(succeeded.at, done['finished_at']):.3f} s after it")

    # A worker killed while its request is in flight: the next worker sends it again.
    state.hold_next = True
    held_job = cancelled_while_queued(service)
    assert state.held.wait(30), "the delivery reached the receiver"
    worker.send_signal(signal.SIGKILL)
    worker.wait()
    state.release.set()
    service.start_worker()
    wait_for(lambda: len(state.of_type("job.cancelled")) == 2, 60, "the resent event")
    resent = next(a for a in state.of_type("job.cancelled") if a.message_id != first.message_id)
    assert resent.payload["data"]["job_id"] == held_job["id"]
    assert state.times_seen(resent.message_id) == 2, "sent again with the same webhook-id"
    assert state.rejected == 0, "every signature verified"
    assert len(state.delivered) == 3
