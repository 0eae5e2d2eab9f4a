"""The `tinker` backend: Thinking Machines' Tinker service through its official SDK.

Tinker's SDK has PyTRIO's call names but its own types, and it submits each call at once
and hands back an `APIFuture` (its `*_async` methods are deprecated). The adapters here
follow the contract: every request is rebuilt from PyTRIO's types into Tinker's (so
Tinker's own models check it), each call submits and returns an awaitable of the result
converted back, and no result is waited on longer than `tinker.call_timeout_seconds`.

- Trainer metrics: Tinker names them `loss:sum`, `<name>:mean`, ...; they come back as
  `loss_sum`, `<name>_mean`, so the `trainer/loss_sum` charts read alike on every backend.
- Saves: Tinker reports only a checkpoint's path, so `model` is the run's base model and
  `size` 0 (unknown). A state name is saved once per run (`save_state_async`).
- Resuming: `load_state_with_optimizer` opens a new training run from the state with
  `create_training_client_from_state_with_optimizer`, as Tinker recommends (`load_state`,
  weights only, with `create_training_client_from_state`); the run made just before it is
  left unused.
- The contract has no close, so Tinker's session (and its heartbeat) lasts as long as the
  process that opened it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

import pydantic
import tinker
from pytrio.types import (
    AdamParams,
    Datum,
    ForwardBackwardOutput,
    ModelInput,
    OptimStepResponse,
    SampleResponse,
    SampleSequence,
    SamplingParams,
    SaveWeightsForSamplerResponse,
    SaveWeightsResponse,
    TensorData,
)
from tinker.auth import tinker_has_credentials
from tinker.types import RequestErrorCategory

from kernel.errors import BackendRejected, OPDError
from kernel.spec import TinkerBackendSpec
from worker.engine.backends.contract import DEFAULT_SAMPLING_PARAMS, ServiceClient
from worker.engine.backends.resilient import (
    AUTH_STATUS_CODES,
    Errors,
    Failure,
    Kind,
    network_failure,
)

T = TypeVar("T")
R = TypeVar("R")

LOGIN_HINT = (
    "set TINKER_API_KEY (a key starting with tml-) in the worker's environment or run "
    "`tinker auth login` on its machine"
)


def transient_status(status: int) -> bool:
    return status in (408, 429) or status >= 500


def classify(error: BaseException) -> Failure | None:
    """Tinker's HTTP errors by status, its failed requests by who is to blame; a request
    Tinker's own types refuse is rejected like one its server refuses."""
    if isinstance(error, tinker.APIStatusError):
        description = f"{error.message} (HTTP {error.status_code})"
        if transient_status(error.status_code):
            return Failure(Kind.transient, description)
        if error.status_code in AUTH_STATUS_CODES:
            return Failure(Kind.auth, description)
        hint = "Set up billing for the key's Tinker account." if error.status_code == 402 else ""
        return Failure(Kind.rejected, description, hint)
    if isinstance(error, tinker.APIConnectionError):
        return Failure(Kind.transient, f"{type(error).__name__}: {error.message}")
    if isinstance(error, tinker.RequestFailedError):
        description = f"{error.message} ({error.category} error)"
        server = error.category is RequestErrorCategory.Server
        return Failure(Kind.transient if server else Kind.rejected, description)
    if isinstance(error, tinker.TinkerError | pydantic.ValidationError):
        return Failure(Kind.rejected, f"{type(error).__name__}: {error}")
    return network_failure(error)


ERRORS = Errors(classify=classify, login_hint=LOGIN_HINT, retry_option="tinker.call_attempts")


def connect_tinker(options: TinkerBackendSpec) -> ServiceClient:
    """Check the credentials, then wrap Tinker's ServiceClient (looked up now, so tests can
    swap it; it opens its session only on the first call)."""
    check_credentials()
    return TinkerService(tinker.ServiceClient(), options.call_timeout_seconds)


def check_credentials() -> None:
    """Fail before any network call when Tinker's SDK has no usable key to send: one from
    TINKER_API_KEY, TINKER_CREDENTIAL_CMD or `tinker auth login` (checked locally)."""
    if not tinker_has_credentials():
        raise OPDError(f"no usable Tinker credentials: {LOGIN_HINT}", code="backend_auth")


async def result_of(future: tinker.APIFuture[T], timeout: float, convert: Callable[[T], R]) -> R:
    """`future`'s result in the engine's types, waited on at most `timeout` seconds."""
    return convert(await future.result_async(timeout=timeout))


def tinker_input(prompt: ModelInput) -> tinker.ModelInput:
    return tinker.ModelInput.model_validate(prompt.model_dump())


def tinker_tensor(tensor: TensorData) -> tinker.TensorData:
    return tinker.TensorData(data=tensor.data, dtype=tensor.dtype, shape=tensor.shape)


def tinker_datum(datum: Datum) -> tinker.Datum:
    inputs = {name: tinker_tensor(value) for name, value in datum.loss_fn_inputs.items()}
    return tinker.Datum(model_input=tinker_input(datum.model_input), loss_fn_inputs=inputs)


def tinker_sampling(params: SamplingParams) -> tinker.SamplingParams:
    return tinker.SamplingParams.model_validate(params.model_dump())


def metric_names(metrics: Mapping[str, float] | None) -> dict[str, float]:
    """`loss:sum` -> `loss_sum`: PyTRIO's spelling of the same metric."""
    return {name.replace(":", "_"): value for name, value in (metrics or {}).items()}


def trio_output(output: tinker.ForwardBackwardOutput) -> ForwardBackwardOutput:
    return ForwardBackwardOutput(
        loss_fn_outputs=[
            {name: TensorData.from_numpy(value.to_numpy()) for name, value in record.items()}
            for record in output.loss_fn_outputs
        ],
        metrics=metric_names(output.metrics),
    )


class TinkerSampler:
    """A Tinker SamplingClient that follows the contract."""

    def __init__(self, sampler: tinker.SamplingClient, timeout: float) -> None:
        self.sampler, self.timeout = sampler, timeout

    def get_tokenizer(self) -> Any:
        return self.sampler.get_tokenizer()

    async def sample_async(
        self,
        prompt: ModelInput,
        num_samples: int = 1,
        sampling_params: SamplingParams = DEFAULT_SAMPLING_PARAMS,
        include_prompt_logprobs: bool = False,
        topk_prompt_logprobs: int = 0,
        return_text: bool = True,
    ) -> SampleResponse:
        """Tinker returns tokens only: the text, when asked for, is the tokenizer's."""
        future = self.sampler.sample(
            tinker_input(prompt),
            num_samples,
            tinker_sampling(sampling_params),
            include_prompt_logprobs=include_prompt_logprobs,
            topk_prompt_logprobs=topk_prompt_logprobs,
        )
        response = await future.result_async(timeout=self.timeout)
        decode = self.get_tokenizer().decode if return_text else None
        sequences = [
            SampleSequence(
                stop_reason=sequence.stop_reason,
                tokens=sequence.tokens,
                logprobs=sequence.logprobs or [],
                text=decode(sequence.tokens) if decode else None,
            )
            for sequence in response.sequences
        ]
        return SampleResponse(
            sequences=sequences,
            prompt_logprobs=response.prompt_logprobs or [],
            topk_prompt_logprobs=response.topk_prompt_logprobs or [],
            input_tokens=prompt.length,
            output_tokens=sum(len(sequence.tokens) for sequence in sequences),
        )

    async def compute_logprobs_async(self, prompt: ModelInput) -> list[float | None]:
        future = self.sampler.compute_logprobs(tinker_input(prompt))
        return await future.result_async(timeout=self.timeout)


class TinkerTrainer:
    """A Tinker TrainingClient that follows the contract. Calls are submitted in order and
    Tinker runs them in that order; each returns an awaitable of its result."""

    def __init__(
        self, service: TinkerService, client: tinker.TrainingClient, base_model: str, rank: int
    ) -> None:
        self.service, self.client = service, client
        self.base_model, self.rank = base_model, rank
        self.timeout = service.timeout
        self.saved: set[str] = set()
        self.trained = False

    def get_tokenizer(self) -> Any:
        return self.client.get_tokenizer()

    async def forward_backward_async(
        self,
        data: list[Datum],
        loss_fn: str = "cross_entropy",
        loss_fn_config: dict[str, float] | None = None,
    ) -> Awaitable[ForwardBackwardOutput]:
        datums = [tinker_datum(datum) for datum in data]
        future = self.client.forward_backward(datums, loss_fn, loss_fn_config)
        self.trained = True
        return result_of(future, self.timeout, trio_output)

    async def optim_step_async(self, adam_params: AdamParams) -> Awaitable[OptimStepResponse]:
        future = self.client.optim_step(tinker.AdamParams.model_validate(adam_params.model_dump()))
        self.trained = True
        return result_of(
            future, self.timeout, lambda done: OptimStepResponse(metrics=metric_names(done.metrics))
        )

    async def save_state_async(self, name: str) -> Awaitable[SaveWeightsResponse]:
        """A name this run saved is refused here, before anything is sent. What is sent may
        overwrite: a save retried after its answer was lost (it had taken effect) then
        writes the same state again instead of failing on its own name."""
        if name in self.saved:
            raise BackendRejected(
                f"the backend rejected save_state: the state {name!r} was saved before in "
                "this run, and a saved state is never overwritten"
            )
        future = self.client.save_state(name, overwrite=True)

        def saved(response: tinker.types.SaveWeightsResponse) -> SaveWeightsResponse:
            self.saved.add(name)
            return SaveWeightsResponse(path=response.path, model=self.base_model, size=0)

        return result_of(future, self.timeout, saved)

    async def load_state_with_optimizer_async(self, path: str) -> Awaitable[None]:
        """A new Tinker run from the state, with its optimizer, in place of this one."""
        create = self.service.client.create_training_client_from_state_with_optimizer
        return await self.load("load_state_with_optimizer", create, path)

    async def load_state_async(self, path: str) -> Awaitable[None]:
        """A new Tinker run from the state's weights (a fresh optimizer), in place of this one."""
        create = self.service.client.create_training_client_from_state
        return await self.load("load_state", create, path)

    async def load(
        self, what: str, create: Callable[..., tinker.APIFuture[Any]], path: str
    ) -> Awaitable[None]:
        if self.trained:
            raise BackendRejected(
                f"the backend rejected {what}: a state is loaded only before the first "
                "training call"
            )
        future = await self.service.submit(create, path, base_model=self.base_model)
        return result_of(future, self.timeout, lambda client: self.resume(what, path, client))

    def resume(self, what: str, path: str, client: tinker.TrainingClient) -> None:
        rank = client.get_info().lora_rank
        if rank is not None and rank != self.rank:
            raise BackendRejected(
                f"the backend rejected {what}: the state {path} has LoRA rank {rank}, the "
                f"job asks for {self.rank}"
            )
        self.client = client

    async def save_weights_for_sampler_async(
        self, name: str
    ) -> Awaitable[SaveWeightsForSamplerResponse]:
        future = self.client.save_weights_for_sampler(name)
        return result_of(
            future,
            self.timeout,
            lambda done: SaveWeightsForSamplerResponse(
                path=done.path, model=self.base_model, size=0
            ),
        )

    async def save_weights_and_get_sampling_client_async(self) -> TinkerSampler:
        future = self.client.save_weights_and_get_sampling_client()
        return TinkerSampler(await future.result_async(timeout=self.timeout), self.timeout)

    async def create_sampling_client_async(self, model_path: str) -> TinkerSampler:
        future = self.client.create_sampling_client(model_path)
        return TinkerSampler(await future.result_async(timeout=self.timeout), self.timeout)


class TinkerService:
    """Tinker's ServiceClient, following the contract."""

    def __init__(self, client: tinker.ServiceClient, timeout: float) -> None:
        self.client, self.timeout = client, timeout

    async def submit(self, call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """A ServiceClient call, made on a thread: the first one opens Tinker's session,
        which blocks on the network."""
        return await asyncio.to_thread(call, *args, **kwargs)

    async def create_lora_training_client_async(
        self, base_model: str, rank: int = 32, seed: int | None = None
    ) -> TinkerTrainer:
        future = await self.submit(
            self.client.create_lora_training_client, base_model, rank=rank, seed=seed
        )
        client = await future.result_async(timeout=self.timeout)
        return TinkerTrainer(self, client, base_model, rank)

    async def create_sampling_client_async(
        self, base_model: str, model_path: str | None = None
    ) -> TinkerSampler:
        future = await self.submit(
            self.client.create_sampling_client, model_path=model_path, base_model=base_model
        )
        return TinkerSampler(await future.result_async(timeout=self.timeout), self.timeout)
