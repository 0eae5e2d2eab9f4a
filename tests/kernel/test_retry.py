"""Bounded backoff: transient failures are retried until the budget runs out; others at once."""

from __future__ import annotations

import pytest

from kernel.retry import Backoff, retry


class Flaky:
    def __init__(self, failures: list[Exception]) -> None:
        self.failures = failures
        self.calls = 0

    async def __call__(self) -> str:
        self.calls += 1
        if self.failures:
            raise self.failures.pop(0)
        return "done"


def transient(error: BaseException) -> bool:
    return isinstance(error, ConnectionError)


async def test_transient_failures_are_retried_until_success():
    flaky = Flaky([ConnectionError("a"), ConnectionError("b")])
    backoff = Backoff(initial=0.001, attempts=3)
    assert await retry(flaky, transient=transient, backoff=backoff, what="x") == "done"
    assert flaky.calls == 3


async def test_attempts_bound_the_retries_and_permanent_errors_are_not_retried():
    flaky = Flaky([ConnectionError("a"), ConnectionError("b"), ConnectionError("c")])
    with pytest.raises(ConnectionError, match="b"):
        await retry(
            flaky, transient=transient, backoff=Backoff(initial=0.001, attempts=2), what="x"
        )
    permanent = Flaky([ValueError("bad request")])
    with pytest.raises(ValueError):
        await retry(permanent, transient=transient, backoff=Backoff(initial=0.001), what="x")
    assert permanent.calls == 1


def test_delays_double_up_to_the_cap_with_jitter():
    backoff = Backoff(initial=1.0, cap=5.0)
    for attempt, full in enumerate([1.0, 2.0, 4.0, 5.0, 5.0]):
        assert full * 0.5 <= backoff.delay(attempt) <= full
