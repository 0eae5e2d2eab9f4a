"""Sending webhook deliveries from the outbox, signed per the Standard Webhooks spec.

Every worker runs a sender: it leases due deliveries, POSTs each (never following a
redirect, within OPD_WEBHOOK_TIMEOUT, only to public addresses unless
OPD_WEBHOOK_ALLOW_PRIVATE), reads at most ANSWER_BYTES of the answer, records the attempt
and schedules the next one with exponential backoff. It sends at most
OPD_WEBHOOK_CONCURRENCY deliveries at once, OPD_WEBHOOK_TEAM_CONCURRENCY of one team, and
fills a place as soon as a send ends. It looks every OPD_WEBHOOK_POLL_INTERVAL seconds, at
once when this worker has just changed a job, and when one of its sends ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import Counter
from datetime import UTC, datetime

import httpx
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from standardwebhooks import Webhook

from app.core.config import Settings
from app.core.encryption import SecretUnreadable, secret_box
from app.webhooks.store import Outcome, Outgoing, record_attempt, take_due
from app.webhooks.urls import UnsafeUrl, resolve

log = logging.getLogger(__name__)
LEASE_MARGIN_SECONDS = 5.0
USER_AGENT = "opd-webhooks/1"
MAX_ERROR_CHARS = 500
ANSWER_BYTES = 4096
"""How much of an answer is read (and dropped: only its status counts). A receiver that
sends more has its connection closed, so a huge answer never fills a worker's memory."""


def body_of(payload: dict) -> str:
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False)


def signed_headers(delivery: Outgoing, secret: str, body: str, now: datetime) -> dict[str, str]:
    """The Standard Webhooks headers: the message id, the time and the HMAC-SHA256 signature
    of `id.timestamp.body` under the webhook's secret."""
    return {
        "webhook-id": delivery.message_id,
        "webhook-timestamp": str(int(now.timestamp())),
        "webhook-signature": Webhook(secret).sign(delivery.message_id, now, body),
        "content-type": "application/json",
        "user-agent": USER_AGENT,
    }


def address_url(url: str, address: str, port: int) -> httpx.URL:
    """The URL with its host replaced by the checked address (the Host header and TLS's
    server name keep the real host)."""
    return httpx.URL(url).copy_with(host=address, port=port)


async def read_at_most(response: httpx.Response, limit: int) -> None:
    """Read and drop the answer's first `limit` bytes (about: one read may bring more). An
    answer read whole leaves its connection for the next request; a longer one's is closed
    when the stream is left."""
    read = 0
    async for chunk in response.aiter_raw():
        read += len(chunk)
        if read >= limit:
            return


class Sender:
    """One worker's sender of deliveries."""

    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        settings: Settings,
        worker_id: str,
    ) -> None:
        self.sessions = sessions
        self.settings = settings
        self.worker_id = worker_id
        self.box = secret_box(settings)
        self.woken = asyncio.Event()
        self.sending: dict[asyncio.Task[None], int] = {}
        """Each send in flight, with its delivery's team."""
        self.http = httpx.AsyncClient(
            follow_redirects=False, timeout=settings.webhook_timeout, trust_env=False
        )

    @property
    def lease_seconds(self) -> float:
        """Longer than a whole attempt (cut at the timeout) and its record: a live sender is
        never overtaken, a dead one's deliveries are sent again soon."""
        return self.settings.webhook_timeout + LEASE_MARGIN_SECONDS

    def wake(self) -> None:
        self.woken.set()

    async def run_forever(self) -> None:
        while True:
            try:
                await self.send_due()
            except Exception as error:  # the database may be away: try again later
                log.warning("webhook sending failed: %s", error)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.woken.wait(), self.settings.webhook_poll_interval)
            self.woken.clear()

    async def send_due(self) -> list[asyncio.Task[None]]:
        """Lease as many due deliveries as there are free places (in all, and for each
        team) and start sending them; returns the sends started. Each one, as it ends,
        frees its place and wakes the sender."""
        room = self.settings.webhook_concurrency - len(self.sending)
        if room <= 0:
            return []
        team_limit = self.settings.webhook_team_concurrency
        busy = Counter(self.sending.values())
        async with self.sessions() as session:
            taken = await take_due(session, self.lease_seconds, room, team_limit, busy)
        started = []
        for delivery in taken:
            task = asyncio.create_task(self.deliver(delivery))
            self.sending[task] = delivery.team_id
            task.add_done_callback(self.sent)
            started.append(task)
        return started

    def sent(self, task: asyncio.Task[None]) -> None:
        del self.sending[task]
        if not task.cancelled() and (error := task.exception()) is not None:
            # The database may be away: the lease runs out and the delivery is sent again.
            log.warning("webhook sending failed: %s", error)
        self.wake()

    async def deliver(self, delivery: Outgoing) -> None:
        started = time.perf_counter()
        status_code, error = await self.attempt(delivery)
        outcome = Outcome(status_code, error, (time.perf_counter() - started) * 1000)
        backoff = (self.settings.webhook_backoff_seconds, self.settings.webhook_backoff_max_seconds)
        async with self.sessions() as session:
            status = await record_attempt(session, delivery.id, self.worker_id, outcome, backoff)
        log.info(
            "webhook %s (delivery %s): %s -> %s",
            delivery.message_id,
            delivery.id,
            outcome.status_code or outcome.error,
            status.value,
        )

    async def attempt(self, delivery: Outgoing) -> tuple[int | None, str | None]:
        """One POST: the answer's status, and what went wrong if anything."""
        try:
            secret = self.box.open(delivery.sealed_secret)
            target = await resolve(delivery.url, self.settings.webhook_allow_private)
            body = body_of(delivery.payload)
            headers = signed_headers(delivery, secret, body, datetime.now(UTC))
            headers["host"] = httpx.URL(delivery.url).netloc.decode()
            async with (
                asyncio.timeout(self.settings.webhook_timeout),
                self.http.stream(
                    "POST",
                    address_url(delivery.url, target.address, target.port),
                    content=body.encode(),
                    headers=headers,
                    extensions={"sni_hostname": target.host},
                ) as response,
            ):
                await read_at_most(response, ANSWER_BYTES)
        except SecretUnreadable as error:
            log.error("webhook %s (delivery %s): %s", delivery.message_id, delivery.id, error)
            return None, "the service cannot sign this delivery (its operator is told why)"
        except UnsafeUrl as error:
            refused = (delivery.message_id, delivery.id, error.detail)
            log.warning("webhook %s (delivery %s) refused: %s", *refused)
            return None, str(error)
        except TimeoutError:
            return None, f"no answer within {self.settings.webhook_timeout:g} s"
        except httpx.HTTPError as error:
            reason = str(error) or type(error).__name__
            return None, f"{type(error).__name__}: {reason}"[:MAX_ERROR_CHARS]
        if response.is_redirect:
            where = response.headers.get("location", "")
            return response.status_code, f"redirect to {where!r} not followed"
        return response.status_code, None if response.is_success else "the answer was not 2xx"

    async def close(self) -> None:
        """Stop the sends in flight (their leases run out and they are sent again)."""
        for task in list(self.sending):
            task.cancel()
        await asyncio.gather(*self.sending, return_exceptions=True)
        await self.http.aclose()
