"""Requests as values, and the two ways of sending them (blocking and asyncio).

An operation of the SDK is written once, as a generator that yields what it needs (a
`Call` to send, a `Pause` to sleep) and gets the `Reply` back; `SyncTransport` and
`AsyncTransport` run it. Both retry the same way (`Retries`) and raise the same errors.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel

from app.core.pages import ObjectList, Page
from kernel.retry import Backoff
from opd.sdk.errors import APIConnectionError, OPDError, api_error, seconds

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)

SHA256_HEADER = "X-Checkpoint-SHA256"
CHUNK = 1 << 20


@dataclass(frozen=True)
class Call:
    """One API request. `resendable`: sending it twice does no more than sending it once
    (reads, job actions, and the POSTs the API answers once per `Idempotency-Key`: job
    submissions, sweeps, playground samples). `waits`: seconds the API may hold it before it
    answers (a playground sample waits for a worker), added to the client's read timeout."""

    method: str
    path: str
    params: Mapping[str, Any] | None = None
    json: Any = None
    headers: Mapping[str, str] = field(default_factory=dict)
    resendable: bool = True
    retry_server_errors: bool = True
    waits: float | None = None
    download: Path | None = None
    upload: Path | None = None
    """A file sent as the body, read in chunks as it goes."""
    sent: Callable[[int], None] | None = None
    """Told the bytes of `upload` sent so far in this attempt (a progress bar)."""

    def after(self, cursor: int | str) -> Call:
        return replace(self, params={**(self.params or {}), "after": cursor})

    def prepared(self) -> Call:
        """Every POST carries an `Idempotency-Key`, the same on each retry of it."""
        if self.method != "POST" or "Idempotency-Key" in self.headers:
            return self
        return replace(self, headers={**self.headers, "Idempotency-Key": f"opd-{uuid.uuid4()}"})


@dataclass(frozen=True)
class Pause:
    seconds: float


@dataclass(frozen=True)
class Reply:
    status: int
    headers: httpx.Headers
    content: bytes = b""
    sha256: str | None = None
    """Of what was written to the call's `download` file."""

    def model(self, kind: type[M]) -> M:
        return kind.model_validate_json(self.content)

    def text(self) -> str:
        return self.content.decode()


Steps = Generator[Call | Pause, Reply | None, T]
"""What an operation is: it yields calls and pauses, and returns its result."""


def fetch(call: Call, kind: type[M]) -> Steps[M]:
    reply = yield call
    assert reply is not None
    return reply.model(kind)


@dataclass(frozen=True)
class Listing:
    """The first page's call of a list operation, and the page type of its answers."""

    call: Call
    page: type[Page[Any] | ObjectList[Any]]
    bind: Any = None
    """Applied to each item (e.g. to give a job its client)."""

    def items(self, page: Page[Any] | ObjectList[Any]) -> list[Any]:
        return [self.bind(item) for item in page.data] if self.bind else page.data


NEVER_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
"""Transport errors raised before any byte of the request left: always safe to retry."""


@dataclass(frozen=True)
class Retries:
    """Transport errors, 5xx and 429 are retried `attempts` times with `backoff`; a 429 waits
    its `Retry-After` (up to `max_retry_after` seconds; longer, and it is raised). A call that
    may not be sent twice is retried only when it cannot have reached the API."""

    attempts: int = 4
    backoff: Backoff = field(default_factory=lambda: Backoff(initial=0.5, cap=8.0))
    max_retry_after: float = 60.0

    def delay(
        self, call: Call, attempt: int, outcome: Reply | httpx.TransportError
    ) -> float | None:
        """Seconds to wait before sending `call` again, or None to give up."""
        if attempt >= self.attempts:
            return None
        backoff = self.backoff.delay(attempt)
        if isinstance(outcome, httpx.TransportError):
            return backoff if call.resendable or isinstance(outcome, NEVER_SENT) else None
        if outcome.status == 429:
            wait = seconds(outcome.headers.get("Retry-After"))
            if wait is None:
                return backoff
            return wait if wait <= self.max_retry_after else None
        if outcome.status >= 500 and call.resendable and call.retry_server_errors:
            return backoff
        return None


def chunks(call: Call) -> Iterator[bytes]:
    """The upload's bytes, read as they are sent (never the whole file at once)."""
    assert call.upload is not None
    done = 0
    with call.upload.open("rb") as source:
        while chunk := source.read(CHUNK):
            done += len(chunk)
            if call.sent is not None:
                call.sent(done)
            yield chunk


async def async_chunks(call: Call) -> AsyncIterator[bytes]:
    for chunk in chunks(call):
        yield chunk


def request(
    http: httpx.Client | httpx.AsyncClient, call: Call, content: Any = None
) -> httpx.Request:
    timeout = http.timeout
    if call.waits is not None and timeout.read is not None:
        timeout = httpx.Timeout(
            timeout.connect, read=timeout.read + call.waits, write=timeout.write, pool=timeout.pool
        )
    if call.download is not None:
        timeout = httpx.Timeout(http.timeout.connect, read=None)
    headers = dict(call.headers)
    if call.upload is not None:
        # The size up front: the API refuses a file past its limits before it arrives.
        headers["Content-Length"] = str(call.upload.stat().st_size)
        timeout = httpx.Timeout(http.timeout.connect, read=None, write=None, pool=None)
    return http.build_request(
        call.method,
        call.path,
        params=call.params,
        json=call.json,
        content=content,
        headers=headers,
        timeout=timeout,
    )


def checked(reply: Reply) -> Reply:
    # A checkpoint's archive names its hash in a header of its own; an uploaded file's
    # ETag is its sha256.
    expected = reply.headers.get(SHA256_HEADER) or reply.headers.get("ETag", "").strip('"')
    if reply.sha256 is not None and reply.sha256 != expected:
        raise OPDError(
            f"the download's SHA-256 is {reply.sha256}, the API said {expected!r}: "
            "the download is corrupt, try again"
        )
    return reply


Outcome = Reply | httpx.TransportError


class Saved:
    """A download written to its file as it arrives, hashed on the way."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.digest = hashlib.sha256()

    def __enter__(self) -> Saved:
        self.out = self.path.open("wb")
        return self

    def __exit__(self, *exc: object) -> None:
        self.out.close()

    def write(self, chunk: bytes) -> None:
        self.digest.update(chunk)
        self.out.write(chunk)

    def reply(self, answer: httpx.Response) -> Reply:
        return Reply(answer.status_code, answer.headers, sha256=self.digest.hexdigest())


def attempts(call: Call, retries: Retries, url: object) -> Generator[Call | Pause, Outcome, Reply]:
    """Sending `call` until it is answered, as steps: each yielded call is sent once and its
    reply (or transport error) sent back; raises what the caller gets when retries end."""
    call = call.prepared()
    attempt = 0
    while True:
        outcome = yield call
        if isinstance(outcome, Reply) and outcome.status < 400:
            return checked(outcome)
        delay = retries.delay(call, attempt, outcome)
        if delay is None and isinstance(outcome, Reply):
            raise api_error(outcome.status, outcome.content, outcome.headers.get("Retry-After"))
        if delay is None:
            raise APIConnectionError(
                f"cannot reach the OPD API at {url}: {outcome!r}; is the service running "
                "there? Give its address with --url or OPD_URL"
            )
        yield Pause(delay)
        attempt += 1


class SyncTransport:
    def __init__(self, http: httpx.Client, retries: Retries) -> None:
        self.http = http
        self.retries = retries

    def once(self, call: Call) -> Outcome:
        try:
            content = chunks(call) if call.upload is not None else None
            answer = self.http.send(request(self.http, call, content), stream=True)
        except httpx.TransportError as error:
            return error
        try:
            if call.download is None or not answer.is_success:
                return Reply(answer.status_code, answer.headers, answer.read())
            with Saved(call.download) as saved:
                for chunk in answer.iter_bytes(CHUNK):
                    saved.write(chunk)
            return saved.reply(answer)
        except httpx.TransportError as error:
            return error
        finally:
            answer.close()

    def drive(self, steps: Generator[Call | Pause, Any, T], on_call: Callable[[Call], Any]) -> T:
        """Run `steps`: sleep through its pauses, answer its calls with `on_call`."""
        answer = None
        try:
            while True:
                step = steps.send(answer)
                if isinstance(step, Pause):
                    time.sleep(step.seconds)
                    answer = None
                else:
                    answer = on_call(step)
        except StopIteration as done:
            return done.value
        finally:
            steps.close()

    def send(self, call: Call) -> Reply:
        return self.drive(attempts(call, self.retries, self.http.base_url), self.once)

    def run(self, steps: Steps[T]) -> T:
        return self.drive(steps, self.send)

    def iterate(self, listing: Listing) -> Iterator[Any]:
        call = listing.call
        while True:
            page = self.send(call).model(listing.page)
            yield from listing.items(page)
            if (cursor := page.cursor()) is None:
                return
            call = call.after(cursor)


class AsyncTransport:
    def __init__(self, http: httpx.AsyncClient, retries: Retries) -> None:
        self.http = http
        self.retries = retries

    async def once(self, call: Call) -> Outcome:
        try:
            content = async_chunks(call) if call.upload is not None else None
            answer = await self.http.send(request(self.http, call, content), stream=True)
        except httpx.TransportError as error:
            return error
        try:
            if call.download is None or not answer.is_success:
                return Reply(answer.status_code, answer.headers, await answer.aread())
            with Saved(call.download) as saved:
                async for chunk in answer.aiter_bytes(CHUNK):
                    saved.write(chunk)
            return saved.reply(answer)
        except httpx.TransportError as error:
            return error
        finally:
            await answer.aclose()

    async def drive(
        self, steps: Generator[Call | Pause, Any, T], on_call: Callable[[Call], Awaitable[Any]]
    ) -> T:
        answer = None
        try:
            while True:
                step = steps.send(answer)
                if isinstance(step, Pause):
                    await asyncio.sleep(step.seconds)
                    answer = None
                else:
                    answer = await on_call(step)
        except StopIteration as done:
            return done.value
        finally:
            steps.close()

    async def send(self, call: Call) -> Reply:
        return await self.drive(attempts(call, self.retries, self.http.base_url), self.once)

    async def run(self, steps: Steps[T]) -> T:
        return await self.drive(steps, self.send)

    async def iterate(self, listing: Listing) -> AsyncIterator[Any]:
        call = listing.call
        while True:
            page = (await self.send(call)).model(listing.page)
            for item in listing.items(page):
                yield item
            if (cursor := page.cursor()) is None:
                return
            call = call.after(cursor)
