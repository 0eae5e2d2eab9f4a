"""Running model work off the event loop: one call at a time, in call order, batched.

Torch calls block for seconds, so they run on a worker thread and the worker's heartbeats
keep flowing. One thread serialises every model access and keeps submission order, so a
`forward_backward` submitted before an `optim_step` runs before it even when neither has
been awaited yet. Concurrent requests made in the same event-loop turn (the loop gathers
one `sample` per prompt) are coalesced into one batched call.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Generic, TypeVar

Request = TypeVar("Request")
Result = TypeVar("Result")


class SerialRunner:
    """Runs blocking functions on one thread, in the order they were submitted."""

    def __init__(self, initializer: Callable[[], None] | None = None) -> None:
        self.executor = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="local-backend", initializer=initializer
        )

    def submit(self, fn: Callable[..., Result], *args: Any) -> asyncio.Future[Result]:
        """Queue `fn(*args)` now; the returned future resolves when it has run."""
        return asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)


class Coalescer(Generic[Request, Result]):
    """Gathers the requests of one event-loop turn into one `run_batch` call."""

    def __init__(
        self, runner: SerialRunner, run_batch: Callable[[list[Request]], list[Result]]
    ) -> None:
        self.runner = runner
        self.run_batch = run_batch
        self.pending: list[tuple[Request, asyncio.Future[Result]]] = []

    async def submit(self, request: Request) -> Result:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Result] = loop.create_future()
        self.pending.append((request, future))
        if len(self.pending) == 1:
            # Runs after every task already scheduled in this turn has made its request.
            loop.call_soon(self.flush)
        return await future

    def flush(self) -> None:
        batch, self.pending = self.pending, []
        done = self.runner.submit(self.run_batch, [request for request, _ in batch])
        done.add_done_callback(lambda outcome: deliver(outcome, [f for _, f in batch]))


def deliver(outcome: asyncio.Future[list[Result]], futures: list[asyncio.Future[Result]]) -> None:
    """Hand each waiter its own result, or the batch's exception."""
    for index, future in enumerate(futures):
        if future.done():
            continue
        if outcome.cancelled():
            future.cancel()
        elif (error := outcome.exception()) is not None:
            future.set_exception(error)
        else:
            future.set_result(outcome.result()[index])
