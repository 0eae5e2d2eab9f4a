"""Backend calls that ride out a flaky service: transient failures are retried, others fail fast.

Every backend is used through `resilient(...)`, a proxy that follows the contract: each
call is made as its `Call` kind allows (`contract.py`), and a failure that remains becomes
an `OPDError` whose code the job stores and whose message says what to do. Which errors
are transient, and which are about credentials, is the backend's to say (`Errors`).

Only what is safe to repeat is repeated:
- `sample`, `compute_logprobs`, creating clients and saving weights or state are
  idempotent, so the whole call, its result included, is retried (a create that timed out
  after the service acted may leave an unused run behind there; the job is unaffected).
- `forward_backward`, `optim_step` and `load_state_with_optimizer` change the training
  state (gradients accumulate, the optimizer steps). Only their submission is retried:
  a submission that raised never reached the service, which is the assumption PyTRIO's
  own retry makes. Their result may fail after the call took effect, so a failed result
  is explained but never repeated.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Generic, NoReturn, TypeVar, cast

import httpx
from pytrio.types import APIFuture

from kernel.errors import (
    BackendAuth,
    BackendRejected,
    BackendUnavailable,
    OPDError,
    ResultLost,
)
from kernel.retry import Backoff, retry
from worker.engine.backends.contract import Call, ServiceClient, call_spec

T = TypeVar("T")
Warn = Callable[[str, dict[str, Any]], None]
"""Told about each retry: a message and its details, e.g. to record a warning event."""

ONCE = Backoff(attempts=1)


class Kind(StrEnum):
    transient = "transient"
    auth = "auth"
    rejected = "rejected"


@dataclass(frozen=True)
class Failure:
    """What a backend says of one of its errors."""

    kind: Kind
    description: str
    hint: str = ""


NETWORK_ERRORS = (TimeoutError, ConnectionError, httpx.TransportError)
AUTH_STATUS_CODES = (401, 403)


def network_failure(error: BaseException) -> Failure | None:
    """The network beneath every SDK fails transiently: a timeout, a dropped connection."""
    if not isinstance(error, NETWORK_ERRORS):
        return None
    description = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    return Failure(Kind.transient, description)


@dataclass(frozen=True)
class Errors:
    """How one backend's errors read: `classify` gives None for an error that is not the
    backend's (a bug, or an OPDError already)."""

    classify: Callable[[BaseException], Failure | None]
    login_hint: str
    retry_option: str


def backend_failure(
    error: BaseException, what: str, errors: Errors, *, tries: int = 1, repeatable: bool = True
) -> OPDError | None:
    """What a person can act on when the backend call `what` finally failed with `error`."""
    failure = errors.classify(error)
    if failure is None:
        return None
    if failure.kind is Kind.transient and repeatable:
        return BackendUnavailable(
            f"backend call {what} kept failing ({tries} {'try' if tries == 1 else 'tries'}), "
            f"last with: {failure.description}. The backend is unreachable or overloaded: "
            f"submit the job again later, or allow more tries with {errors.retry_option}"
        )
    if failure.kind is Kind.transient:
        return ResultLost(
            f"backend call {what} failed after it was sent ({failure.description}); it may "
            "have taken effect, so it was not repeated"
        )
    hint = f" {failure.hint}" if failure.hint else ""
    if failure.kind is Kind.auth:
        return BackendAuth(
            f"the backend refused the credentials for {what}: {failure.description}.{hint} "
            f"To use another key, {errors.login_hint}"
        )
    return BackendRejected(f"the backend rejected {what}: {failure.description}.{hint}")


def explain(error: Exception, failure: OPDError | None) -> NoReturn:
    if failure is None:
        raise error
    raise failure from error


@dataclass(frozen=True)
class Calls:
    """How the proxies call the backend: how often to try, which errors are transient, and
    whom to tell of a retry."""

    backoff: Backoff
    errors: Errors
    warn: Warn

    def transient(self, error: BaseException) -> bool:
        failure = self.errors.classify(error)
        return failure is not None and failure.kind is Kind.transient

    async def call(
        self, what: str, operation: Callable[[], Awaitable[T]], *, repeatable: bool = True
    ) -> T:
        """`operation`'s result, retrying transient failures if `repeatable`; a final
        backend failure is raised as the OPDError `backend_failure` gives."""
        backoff = self.backoff if repeatable else ONCE
        tries = 0
        last: Exception | None = None

        async def attempt() -> T:
            nonlocal tries, last
            if last is not None:
                description = self.describe(last)
                self.warn(
                    f"Retrying backend call {what} (try {tries + 1} of {backoff.attempts}) "
                    f"after: {description}",
                    {"call": what, "try": tries + 1, "error": description},
                )
            tries += 1
            try:
                return await operation()
            except Exception as error:
                last = error
                raise

        try:
            return await retry(attempt, transient=self.transient, backoff=backoff, what=what)
        except Exception as error:
            failure = backend_failure(error, what, self.errors, tries=tries, repeatable=repeatable)
            explain(error, failure)

    def describe(self, error: BaseException) -> str:
        failure = self.errors.classify(error)
        return failure.description if failure else f"{type(error).__name__}: {error}"


class Settled(Generic[T]):
    """The pending result of a submitted state-changing call; a failure is explained, not
    retried. Nothing runs until it is awaited."""

    def __init__(self, calls: Calls, what: str, result: Awaitable[T]) -> None:
        self.calls, self.what, self.result = calls, what, result

    def __await__(self) -> Generator[Any, None, T]:
        return self.calls.call(self.what, lambda: self.result, repeatable=False).__await__()


class Resilient:
    """A contract object whose every call is made as its `Call` kind allows; clients it
    returns are wrapped the same way. A name outside the contract is an AttributeError."""

    def __init__(self, inner: Any, contract: type, calls: Calls) -> None:
        self.inner, self.contract, self.calls = inner, contract, calls

    def __getattr__(self, name: str) -> Any:
        spec = call_spec(self.contract, name)
        method = getattr(self.inner, name)
        what = name.removesuffix("_async")
        calls = self.calls
        if spec.kind is Call.local:
            return method

        async def proxy(*args: Any, **kwargs: Any) -> Any:
            if spec.kind is Call.state_changing:
                return Settled(calls, what, await calls.call(what, lambda: method(*args, **kwargs)))
            if spec.kind is Call.idempotent_future:

                async def submit_and_wait() -> Any:
                    return await (await method(*args, **kwargs))

                return APIFuture.completed(await calls.call(what, submit_and_wait))
            result = await calls.call(what, lambda: method(*args, **kwargs))
            return result if spec.returns is None else Resilient(result, spec.returns, calls)

        return proxy


def resilient(
    service: ServiceClient,
    errors: Errors,
    warn: Warn,
    backoff: Backoff = ONCE,
    contract: type = ServiceClient,
) -> ServiceClient:
    """`service` with every call of `contract` made as this module describes, tried at
    most `backoff.attempts` times."""
    return cast(ServiceClient, Resilient(service, contract, Calls(backoff, errors, warn)))
