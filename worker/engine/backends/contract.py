"""The backend contract: the slice of PyTRIO's async client API the OPD loop uses, written once.

Every backend (`trio`, `local`, `tinker`) and every test fake follows these Protocols;
PyTRIO's own types (ModelInput, Datum, SamplingParams, AdamParams and the response
models) are the currency. Each method also says how it may be repeated when a remote
service fails transiently (`Call`): `resilient.py` derives its retries from that, and the
conformance suite checks every implementation's signatures against these.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol, TypeVar

from pytrio.types import (
    AdamParams,
    Datum,
    ForwardBackwardOutput,
    ModelInput,
    OptimStepResponse,
    SampleResponse,
    SamplingParams,
    SaveWeightsForSamplerResponse,
    SaveWeightsResponse,
)

from kernel.spec import ObjectiveSpec

TopK = Sequence[tuple[int, float]]
"""A position's likeliest tokens with their logprobs, as samplers return them
(`topk_prompt_logprobs`)."""

F = TypeVar("F", bound=Callable[..., Any])
DEFAULT_SAMPLING_PARAMS = SamplingParams()


class Call(StrEnum):
    """How a contract call behaves, and so how it may be repeated after a transient failure."""

    local = "local"
    """Answered in process (the tokenizer): passed through untouched."""
    idempotent = "idempotent"
    """One awaited result that may be fetched again: the whole call is retried."""
    idempotent_future = "idempotent_future"
    """Submitted, then awaited (saves): submission and result are retried as a whole."""
    state_changing = "state_changing"
    """Submitted, then awaited, and it changes the training state (gradients, optimizer
    step, a load): only a submission that raised is retried; a lost result never is."""


@dataclass(frozen=True)
class CallSpec:
    kind: Call
    returns: type | None = None
    """The contract of a client the call returns, so wrappers wrap it too."""


def call(kind: Call, returns: type | None = None) -> Callable[[F], F]:
    """Mark a contract method with its `Call` kind."""

    def mark(method: F) -> F:
        method.__backend_call__ = CallSpec(kind, returns)  # type: ignore[attr-defined]
        return method

    return mark


def call_spec(contract: type, name: str) -> CallSpec:
    """The kind of `contract.name`; AttributeError for a name outside the contract."""
    spec = getattr(getattr(contract, name, None), "__backend_call__", None)
    if spec is None:
        raise AttributeError(f"{name!r} is not part of the backend contract {contract.__name__}")
    return spec


def contract_methods(contract: type) -> list[str]:
    """Every method name of a contract, in definition order."""
    return [name for name, member in vars(contract).items() if hasattr(member, "__backend_call__")]


class SamplingClient(Protocol):
    @call(Call.local)
    def get_tokenizer(self) -> Any: ...

    @call(Call.idempotent)
    async def sample_async(
        self,
        prompt: ModelInput,
        num_samples: int = 1,
        sampling_params: SamplingParams = DEFAULT_SAMPLING_PARAMS,
        include_prompt_logprobs: bool = False,
        topk_prompt_logprobs: int = 0,
        return_text: bool = True,
    ) -> SampleResponse:
        """`num_samples` completions, each token with its sampling logprob."""
        ...

    @call(Call.idempotent)
    async def compute_logprobs_async(self, prompt: ModelInput) -> list[float | None]:
        """`None` for the first token, then the logprob of each following token."""
        ...


class TrainingClient(Protocol):
    @call(Call.local)
    def get_tokenizer(self) -> Any: ...

    @call(Call.state_changing)
    async def forward_backward_async(
        self,
        data: list[Datum],
        loss_fn: str = "cross_entropy",
        loss_fn_config: dict[str, float] | None = None,
    ) -> Awaitable[ForwardBackwardOutput]:
        """Add the gradient of the loss summed over every datum's tokens."""
        ...

    @call(Call.state_changing)
    async def optim_step_async(self, adam_params: AdamParams) -> Awaitable[OptimStepResponse]:
        """One AdamW step with the accumulated gradients, which it then clears."""
        ...

    @call(Call.idempotent_future)
    async def save_state_async(self, name: str) -> Awaitable[SaveWeightsResponse]:
        """Weights and optimizer state under `name`; a name saved before in this run (this
        training client) is refused, as PyTRIO's `save_state(overwrite=False)` refuses it."""
        ...

    @call(Call.state_changing)
    async def load_state_with_optimizer_async(self, path: str) -> Awaitable[Any]:
        """Restore a saved state; only before the first training call."""
        ...

    @call(Call.state_changing)
    async def load_state_async(self, path: str) -> Awaitable[Any]:
        """Load only a saved state's weights (the optimizer starts fresh); only before the
        first training call."""
        ...

    @call(Call.idempotent_future)
    async def save_weights_for_sampler_async(
        self, name: str
    ) -> Awaitable[SaveWeightsForSamplerResponse]:
        """The current weights in a form a sampling client (or a teacher) can load."""
        ...

    @call(Call.idempotent, returns=SamplingClient)
    async def save_weights_and_get_sampling_client_async(self) -> SamplingClient:
        """A sampler that keeps the current weights, whatever training does later."""
        ...

    @call(Call.idempotent, returns=SamplingClient)
    async def create_sampling_client_async(self, model_path: str) -> SamplingClient:
        """A sampler of the weights `save_weights_for_sampler` saved at `model_path` (in
        this run or an earlier one of the same model): it samples as the sampler made from
        the training client at that moment would."""
        ...


@dataclass(frozen=True)
class ByteView:
    """How a teacher with another tokenizer reads a completion, for a logit-level objective
    over the next byte (`local/next_byte.py`): the completion as its own tokens and, for each
    of the student's completion tokens, the teacher token its first byte falls in (-1 where
    the two texts have parted before it), the bytes of that teacher token before it, and the
    teacher's logprob of the student token's bytes (the chain rule's mapping, which judges
    the bytes after its first)."""

    tokens: Sequence[int]
    positions: Sequence[int]
    written: Sequence[bytes]
    logprobs: Sequence[float]


@dataclass(frozen=True)
class TeacherShare:
    """One teacher of a datum as a logit-level objective reads it: its sampler, its weight
    in the datum's mixture, and the tokens it reads before the completion."""

    client: SamplingClient
    weight: float = 1.0
    prompt: Sequence[int] | None = None
    """Its own rendering of the question (its chat template, a self teacher's context);
    None: the datum's own prompt."""
    view: ByteView | None = None
    """A teacher with another tokenizer: the completion as it reads it (its tokens follow
    its `prompt`); the objective then compares the next byte's distributions."""


class LogitTrainingClient(TrainingClient, Protocol):
    """A training client that can also train a logit-level objective: the local backend
    every one, from its teachers' models; Tinker forward_kl over the teacher's top k, from
    the top k each datum carries (`teacher_tokens`, `teacher_probs`)."""

    @call(Call.state_changing)
    async def forward_backward_logits_async(
        self,
        data: list[Datum],
        teachers: list[list[TeacherShare]],
        objective: ObjectiveSpec,
        coef: float = 1.0,
        loss_fn: str = "importance_sampling",
        loss_fn_config: dict[str, float] | None = None,
    ) -> Awaitable[ForwardBackwardOutput]:
        """Add the gradient of `coef` times the objective between the student's and each
        datum's teachers' mixture at its completion positions (`weights` 1), each teacher
        after its own prompt, plus `loss_fn` of its advantages there, divided by the
        number of them. Each datum's output holds its target tokens' `logprobs` and,
        where the trainer reads the teachers itself (the local backend), their
        `teacher_logprobs`."""
        ...


class SelfTeachingClient(LogitTrainingClient, Protocol):
    """A training client whose base model scores too, its adapter off, with no second copy
    of the weights (the local backend): a self teacher of `base` weights."""

    @call(Call.idempotent, returns=SamplingClient)
    async def base_sampling_client_async(self) -> SamplingClient:
        """A sampler of the base model this client trains, its adapter off; training
        never sees the adapter off."""
        ...


class ServiceClient(Protocol):
    @call(Call.idempotent, returns=TrainingClient)
    async def create_lora_training_client_async(
        self, base_model: str, rank: int = 32, seed: int | None = None
    ) -> TrainingClient: ...

    @call(Call.idempotent, returns=SamplingClient)
    async def create_sampling_client_async(
        self, base_model: str, model_path: str | None = None
    ) -> SamplingClient: ...


class LogitServiceClient(ServiceClient, Protocol):
    """A service whose training clients train logit-level objectives too."""

    @call(Call.idempotent, returns=LogitTrainingClient)
    async def create_lora_training_client_async(
        self, base_model: str, rank: int = 32, seed: int | None = None
    ) -> LogitTrainingClient: ...


class SelfTeachingService(LogitServiceClient, Protocol):
    """A service whose training clients score with their base model too (the local one)."""

    @call(Call.idempotent, returns=SelfTeachingClient)
    async def create_lora_training_client_async(
        self, base_model: str, rank: int = 32, seed: int | None = None
    ) -> SelfTeachingClient: ...
