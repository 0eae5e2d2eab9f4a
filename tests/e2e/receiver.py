"""A real HTTP receiver of webhooks, as a team would write one: it verifies each delivery's
Standard Webhooks signature and keeps each `webhook-id` once. It can be told to fail the
next requests, to hold the next one (or every one) without answering (to kill a sender
meanwhile, or to be a slow receiver), or to answer with a huge body."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from standardwebhooks import Webhook, WebhookVerificationError

HOLD_SECONDS = 30.0
ANSWER_CHUNK = 64 * 1024


@dataclass
class Arrival:
    message_id: str
    payload: dict[str, Any]
    at: float
    """time.time() when it arrived."""


@dataclass
class Receiver:
    secret: str = ""
    fail_next: int = 0
    hold_next: bool = False
    hold_all: bool = False
    """Hold every request, not only the next, until `release`."""
    holding: int = 0
    """Requests held now."""
    answer_bytes: int = 0
    """The size of each answer's body (a 200 rather than a 204 when not 0)."""
    answered: list[int] = field(default_factory=list)
    """The body bytes each answer got out before it ended or its connection was closed."""
    held: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)
    arrivals: list[Arrival] = field(default_factory=list)
    """Every verified request, repeats included."""
    delivered: dict[str, Arrival] = field(default_factory=dict)
    """Each message once (by webhook-id): what the receiver acts on."""
    rejected: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def handle(self, body: bytes, headers: dict[str, str]) -> int:
        try:
            payload = Webhook(self.secret).verify(body, headers)
        except WebhookVerificationError:
            with self.lock:
                self.rejected += 1
            return 401
        arrival = Arrival(headers["webhook-id"], payload, time.time())
        with self.lock:
            self.arrivals.append(arrival)
            if self.hold_next or self.hold_all:
                self.hold_next = False
                holding = True
                self.holding += 1
            else:
                holding = False
            if not holding and self.fail_next > 0:
                self.fail_next -= 1
                return 500
        if holding:
            self.held.set()
            self.release.wait(HOLD_SECONDS)
            with self.lock:
                self.holding -= 1
            return 503
        with self.lock:
            self.delivered.setdefault(arrival.message_id, arrival)
        return 200 if self.answer_bytes else 204

    def answer(self, out: Any) -> None:
        """Write the answer's body to `out`, a chunk at a time, until all is out or the
        sender closed the connection."""
        chunk = b"x" * ANSWER_CHUNK
        written = 0
        try:
            while written < self.answer_bytes:
                written += out.write(chunk[: self.answer_bytes - written])
        except (BrokenPipeError, ConnectionResetError):
            pass
        with self.lock:
            self.answered.append(written)

    def of_type(self, event: str) -> list[Arrival]:
        with self.lock:
            return [a for a in self.delivered.values() if a.payload["type"] == event]

    def times_seen(self, message_id: str) -> int:
        with self.lock:
            return sum(1 for a in self.arrivals if a.message_id == message_id)


class Server:
    """The receiver on 127.0.0.1, in a thread of the test process."""

    def __init__(self, receiver: Receiver) -> None:
        outer = receiver

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["content-length"]))
                status = outer.handle(body, dict(self.headers))
                self.send_response(status)
                self.send_header("content-length", str(outer.answer_bytes))
                self.end_headers()
                if outer.answer_bytes:
                    outer.answer(self.wfile)

            def log_message(self, *args: Any) -> None:
                return

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/opd-events"

    def __enter__(self) -> Server:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def wait_for(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
