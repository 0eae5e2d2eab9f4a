"""The SDK's retries against a real HTTP server that answers what the test scripts (503,
429 with Retry-After, a dropped connection): what is retried, how long it waits, and that
a retried POST carries the same Idempotency-Key and body (the spec as written) every time."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from app.sweeps.schemas import SweepCreate
from kernel.retry import Backoff
from kernel.spec import parse_spec
from opd.sdk import (
    APIConnectionError,
    AsyncClient,
    Client,
    RateLimited,
    Retries,
    ServerError,
    ValidationError,
)
from tests.support import named

FAST = Retries(attempts=3, backoff=Backoff(initial=0.01, cap=0.05))
KEYS = (200, {}, {"data": []})


class Scripted(ThreadingHTTPServer):
    """Answers each request with the next scripted (status, headers, body); `None` closes
    the connection without an answer. Records what it received."""

    daemon_threads = True

    def __init__(self, answers: list[tuple[int, dict[str, str], Any] | None]) -> None:
        super().__init__(("127.0.0.1", 0), ScriptedHandler)
        self.answers = answers
        self.received: list[tuple[float, str, str, dict[str, str]]] = []
        self.bodies: list[Any] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class ScriptedHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Scripted

    def answer(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.server.bodies.append(json.loads(body) if body else None)
        self.server.received.append(
            (time.monotonic(), self.command, self.path, dict(self.headers.items()))
        )
        scripted = self.server.answers.pop(0)
        if scripted is None:
            self.close_connection = True
            return
        status, headers, body = scripted
        content = json.dumps(body).encode()
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(content)))
        self.end_headers()
        self.wfile.write(content)

    do_GET = do_POST = do_DELETE = answer

    def log_message(self, *args: Any) -> None:
        pass


def failure(status: int, code: str) -> tuple[int, dict[str, str], Any]:
    return status, {}, {"error": {"code": code, "message": f"{code}!", "param": None}}


@pytest.fixture
def serve() -> Iterator[Any]:
    servers: list[Scripted] = []

    def start(*answers: tuple[int, dict[str, str], Any] | None) -> Scripted:
        server = Scripted(list(answers))
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def test_5xx_and_dropped_connections_are_retried_then_answered(serve):
    server = serve(failure(503, "database_unavailable"), None, KEYS)
    with Client(server.url, "k", retries=FAST) as client:
        assert client.keys.list() == []
    assert len(server.received) == 3


def test_a_429_waits_its_retry_after(serve):
    server = serve((429, {"Retry-After": "1"}, {"error": {"code": "x", "message": "m"}}), KEYS)
    with Client(server.url, "k", retries=FAST) as client:
        assert client.keys.list() == []
    (first, *_), (second, *_) = server.received
    assert second - first >= 1.0  # never sooner than the server asked


def test_a_retry_after_longer_than_allowed_is_raised_at_once(serve):
    server = serve((429, {"Retry-After": "600"}, {"error": {"code": "full", "message": "m"}}))
    with Client(server.url, "k", retries=FAST) as client, pytest.raises(RateLimited) as error:
        client.keys.list()
    assert error.value.retry_after == 600 and error.value.code == "full"


def test_a_retried_post_carries_one_idempotency_key(serve):
    server = serve(
        failure(502, "bad_gateway"), None, failure(503, "x"), failure(500, "internal_error")
    )
    with Client(server.url, "k", retries=FAST) as client, pytest.raises(ServerError) as error:
        client.jobs.cancel(1)
    assert error.value.status == 500 and error.value.code == "internal_error"
    keys = {headers["Idempotency-Key"] for _, method, _, headers in server.received}
    assert len(server.received) == 1 + FAST.attempts
    assert len(keys) == 1 and keys.pop().startswith("opd-")

    given = serve(failure(422, "invalid_request"))
    with Client(given.url, "k", retries=FAST) as client, pytest.raises(ValidationError):
        client.jobs.create({"name": "x"}, idempotency_key="mine")
    assert given.received[0][3]["Idempotency-Key"] == "mine"  # a 422 is not retried


def test_a_job_is_submitted_as_written_so_a_retry_survives_an_upgrade(serve):
    """Defaults are the service's to fill, not part of the request: the same key and spec
    are the same request after either side gains a field with a default."""
    server = serve(failure(503, "database_unavailable"), failure(422, "invalid_request"))
    written = named({"name": "mine", "loop": {"steps": 3}})
    with Client(server.url, "k", retries=FAST) as client, pytest.raises(ValidationError):
        client.jobs.create(parse_spec(written), idempotency_key="retry-1")
    assert server.bodies == [written, written]
    assert {headers["Idempotency-Key"] for *_, headers in server.received} == {"retry-1"}


def test_a_post_that_may_not_be_sent_twice_is_not_retried_once_it_may_have_arrived(serve):
    server = serve(failure(503, "database_unavailable"), None)
    with Client(server.url, "k", retries=FAST) as client:
        with pytest.raises(ServerError):
            client.webhooks.create("https://example.com/hook", ["job.succeeded"])
        with pytest.raises(APIConnectionError):
            client.keys.create("team")
    assert len(server.received) == 2  # one each


def test_a_sweep_is_resent_with_its_idempotency_key_as_written(serve):
    server = serve(failure(503, "database_unavailable"), failure(422, "invalid_request"))
    written = {
        "name": "lr",
        "base_job": 1,
        "parameters": {"optim.learning_rate": {"values": [1e-4, 1e-3]}},
        "metric": {"name": "eval/accuracy", "goal": "maximize"},
    }
    with Client(server.url, "k", retries=FAST) as client, pytest.raises(ValidationError):
        client.sweeps.create(SweepCreate.model_validate(written))
    assert server.bodies == [written, written]  # as written: the defaults are the API's
    (key,) = {headers["Idempotency-Key"] for *_, headers in server.received}
    assert key.startswith("opd-")


def test_asyncio_retries_the_same_way(serve):
    server = serve(failure(503, "x"), None, KEYS)

    async def keys() -> list[Any]:
        async with AsyncClient(server.url, "k", retries=FAST) as client:
            return await client.keys.list()

    assert asyncio.run(keys()) == [] and len(server.received) == 3


def test_no_server_is_an_api_connection_error_after_the_retries(serve):
    server = serve()
    url = server.url
    server.shutdown()
    server.server_close()
    with Client(url, "k", retries=FAST) as client, pytest.raises(APIConnectionError) as error:
        client.keys.list()
    assert url in str(error.value)
