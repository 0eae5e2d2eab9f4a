"""Bounded exponential backoff with jitter, for database writes and backend calls."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Backoff:
    """Delays 1x, 2x, 4x ... `initial`, capped at `cap`, each scaled by a random 50-100%,
    until `attempts` tries or `deadline` seconds have passed (None = no such limit)."""

    initial: float = 0.5
    cap: float = 10.0
    attempts: int | None = None
    deadline: float | None = None

    def delay(self, attempt: int) -> float:
        return min(self.cap, self.initial * 2**attempt) * random.uniform(0.5, 1.0)


async def retry(
    operation: Callable[[], Awaitable[T]],
    *,
    transient: Callable[[BaseException], bool],
    backoff: Backoff,
    what: str,
) -> T:
    """Run `operation`, retrying the errors `transient` accepts; others propagate at once."""
    started = time.monotonic()
    attempt = 0
    while True:
        try:
            return await operation()
        except Exception as error:
            attempt += 1
            out_of_tries = backoff.attempts is not None and attempt >= backoff.attempts
            delay = backoff.delay(attempt - 1)
            late = (
                backoff.deadline is not None
                and time.monotonic() - started + delay > backoff.deadline
            )
            if not transient(error) or out_of_tries or late:
                raise
            log.warning(
                "%s failed (attempt %d), retrying in %.1fs: %s", what, attempt, delay, error
            )
            await asyncio.sleep(delay)
