"""Backend calls that ride out a flaky service: transient failures are retried, others fail fast.

PyTRIO already retries each HTTP request. A call that still fails transiently (a timeout,
HTTP 408/429/5xx, a dropped connection) is tried again here as a whole, with bounded
exponential backoff and jitter, and every retry is reported. A permanent failure (bad
credentials, a rejected request) is not retried: it becomes an `OPDError` whose code
the job stores and whose message says what to do.

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
from typing import Any, Generic, NoReturn, TypeVar

import httpx
from pytrio.auth.flow import is_relogin_auth_error
from pytrio.errors.auth import AuthError
from pytrio.errors.base import PyTrioError
from pytrio.types import (
    AdamParams,
    APIFuture,
    Datum,
    ForwardBackwardOutput,
    ModelInput,
    OptimStepResponse,
    SampleResponse,
    SamplingParams,
    SaveWeightsForSamplerResponse,
    SaveWeightsResponse,
)

from kernel.errors import BackendAuth, BackendRejected, BackendUnavailable, OPDError
from kernel.retry import Backoff, retry
from kernel.spec import MAX_RETRY_DELAY_SECONDS, TrioBackendSpec
from worker.engine.backends.base import SamplingClient, ServiceClient, TrainingClient
from worker.engine.backends.trio import LOGIN_HINT

T = TypeVar("T")
Warn = Callable[[str, dict[str, Any]], None]
"""Told about each retry: a message and its details, e.g. to record a warning event."""

NETWORK_ERRORS = (TimeoutError, ConnectionError, httpx.TransportError)
AUTH_STATUS_CODES = (401, 403)
ONCE = Backoff(attempts=1)


def is_transient(error: BaseException) -> bool:
    """Worth another try: PyTRIO says so, or the network failed underneath it."""
    if isinstance(error, PyTrioError):
        return error.retryable
    return isinstance(error, NETWORK_ERRORS)


def is_auth(error: PyTrioError) -> bool:
    return (
        isinstance(error, AuthError)
        or is_relogin_auth_error(error)
        or error.status_code in AUTH_STATUS_CODES
    )


def describe(error: BaseException) -> str:
    if isinstance(error, PyTrioError):
        status = f", HTTP {error.status_code}" if error.status_code else ""
        return f"{error.message} ({error.code}{status})"
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__


def backend_failure(
    error: BaseException, what: str, *, tries: int = 1, repeatable: bool = True
) -> OPDError | None:
    """What a person can act on when the backend call `what` finally failed with `error`;
    None when `error` is not the backend's (a bug, or an OPDError already)."""
    if is_transient(error) and repeatable:
        return BackendUnavailable(
            f"backend call {what} kept failing ({tries} {'try' if tries == 1 else 'tries'}), "
            f"last with: {describe(error)}. The backend is unreachable or overloaded: submit "
            "the job again later, or allow more tries with trio.call_attempts"
        )
    if is_transient(error):
        return BackendUnavailable(
            f"backend call {what} failed after it was sent ({describe(error)}); it may have "
            "taken effect, so it was not repeated. Submit the job again once the backend "
            "is healthy"
        )
    if not isinstance(error, PyTrioError):
        return None
    hint = f" {error.hint}" if error.hint else ""
    if is_auth(error):
        return BackendAuth(
            f"the backend refused the credentials for {what}: {describe(error)}.{hint} "
            f"To use another key, {LOGIN_HINT}"
        )
    return BackendRejected(f"the backend rejected {what}: {describe(error)}.{hint}")


def explain(error: Exception, failure: OPDError | None) -> NoReturn:
    if failure is None:
        raise error
    raise failure from error


@dataclass(frozen=True)
class Calls:
    """How the proxies call the backend: how often to try, and whom to tell of a retry."""

    backoff: Backoff
    warn: Warn

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
                self.warn(
                    f"Retrying backend call {what} (try {tries + 1} of {backoff.attempts}) "
                    f"after: {describe(last)}",
                    {"call": what, "try": tries + 1, "error": describe(last)},
                )
            tries += 1
            try:
                return await operation()
            except Exception as error:
                last = error
                raise

        try:
            return await retry(attempt, transient=is_transient, backoff=backoff, what=what)
        except Exception as error:
            explain(error, backend_failure(error, what, tries=tries, repeatable=repeatable))

    async def resolved(
        self, what: str, submit: Callable[[], Awaitable[Awaitable[T]]]
    ) -> APIFuture[T]:
        """An idempotent two-stage call (submit, then await its result) retried as a whole."""

        async def submit_and_wait() -> T:
            return await (await submit())

        return APIFuture.completed(await self.call(what, submit_and_wait))

    async def submitted(
        self, what: str, submit: Callable[[], Awaitable[Awaitable[T]]]
    ) -> Settled[T]:
        """A state-changing call: its submission is retried, its result never."""
        return Settled(self, what, await self.call(what, submit))


class Settled(Generic[T]):
    """The pending result of a submitted state-changing call; a failure is explained, not
    retried. Nothing runs until it is awaited."""

    def __init__(self, calls: Calls, what: str, result: Awaitable[T]) -> None:
        self.calls, self.what, self.result = calls, what, result

    def __await__(self) -> Generator[Any, None, T]:
        return self.calls.call(self.what, lambda: self.result, repeatable=False).__await__()


class ResilientSamplingClient:
    def __init__(self, inner: SamplingClient, calls: Calls) -> None:
        self.inner, self.calls = inner, calls

    def get_tokenizer(self) -> Any:
        return self.inner.get_tokenizer()

    async def sample_async(
        self,
        prompt: ModelInput,
        num_samples: int = 1,
        sampling_params: SamplingParams = SamplingParams(),  # noqa: B008 - immutable default
        include_prompt_logprobs: bool = False,
        topk_prompt_logprobs: int = 0,
        return_text: bool = True,
    ) -> SampleResponse:
        return await self.calls.call(
            "sample",
            lambda: self.inner.sample_async(
                prompt,
                num_samples=num_samples,
                sampling_params=sampling_params,
                include_prompt_logprobs=include_prompt_logprobs,
                topk_prompt_logprobs=topk_prompt_logprobs,
                return_text=return_text,
            ),
        )

    async def compute_logprobs_async(self, prompt: ModelInput) -> list[float | None]:
        return await self.calls.call(
            "compute_logprobs", lambda: self.inner.compute_logprobs_async(prompt)
        )


class ResilientTrainingClient:
    def __init__(self, inner: TrainingClient, calls: Calls) -> None:
        self.inner, self.calls = inner, calls

    def get_tokenizer(self) -> Any:
        return self.inner.get_tokenizer()

    async def forward_backward_async(
        self, data: list[Datum], loss_fn: str = "cross_entropy"
    ) -> Settled[ForwardBackwardOutput]:
        return await self.calls.submitted(
            "forward_backward", lambda: self.inner.forward_backward_async(data, loss_fn=loss_fn)
        )

    async def optim_step_async(self, adam_params: AdamParams) -> Settled[OptimStepResponse]:
        return await self.calls.submitted(
            "optim_step", lambda: self.inner.optim_step_async(adam_params)
        )

    async def load_state_with_optimizer_async(self, path: str) -> Settled[Any]:
        return await self.calls.submitted(
            "load_state_with_optimizer", lambda: self.inner.load_state_with_optimizer_async(path)
        )

    async def save_state_async(self, name: str) -> APIFuture[SaveWeightsResponse]:
        return await self.calls.resolved("save_state", lambda: self.inner.save_state_async(name))

    async def save_weights_for_sampler_async(
        self, name: str
    ) -> APIFuture[SaveWeightsForSamplerResponse]:
        return await self.calls.resolved(
            "save_weights_for_sampler", lambda: self.inner.save_weights_for_sampler_async(name)
        )

    async def save_weights_and_get_sampling_client_async(self) -> ResilientSamplingClient:
        sampler = await self.calls.call(
            "save_weights_and_get_sampling_client",
            self.inner.save_weights_and_get_sampling_client_async,
        )
        return ResilientSamplingClient(sampler, self.calls)


class ResilientServiceClient:
    def __init__(self, inner: ServiceClient, calls: Calls) -> None:
        self.inner, self.calls = inner, calls

    async def create_lora_training_client_async(
        self, base_model: str, rank: int = 32, seed: int | None = None
    ) -> ResilientTrainingClient:
        training = await self.calls.call(
            "create_lora_training_client",
            lambda: self.inner.create_lora_training_client_async(base_model, rank=rank, seed=seed),
        )
        return ResilientTrainingClient(training, self.calls)

    async def create_sampling_client_async(
        self, base_model: str, model_path: str | None = None
    ) -> ResilientSamplingClient:
        sampler = await self.calls.call(
            "create_sampling_client",
            lambda: self.inner.create_sampling_client_async(base_model, model_path=model_path),
        )
        return ResilientSamplingClient(sampler, self.calls)


def resilient(service: ServiceClient, options: TrioBackendSpec, warn: Warn) -> ServiceClient:
    """`service` with every call made as this module describes, tried at most
    `options.call_attempts` times."""
    backoff = Backoff(
        initial=options.call_retry_delay_seconds,
        cap=MAX_RETRY_DELAY_SECONDS,
        attempts=options.call_attempts,
    )
    return ResilientServiceClient(service, Calls(backoff, warn))
