"""The backend interface: the slice of PyTRIO's async client API the OPD loop uses.

PyTRIO's own types (ModelInput, Datum, SamplingParams, AdamParams and the response
models) are the currency, so the `trio` backend is PyTRIO itself and the `local`
backend is a drop-in with the same call names and semantics.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any, Protocol

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


class SamplingClient(Protocol):
    def get_tokenizer(self) -> Any: ...

    async def sample_async(
        self,
        prompt: ModelInput,
        num_samples: int = 1,
        sampling_params: SamplingParams = ...,
        include_prompt_logprobs: bool = False,
        topk_prompt_logprobs: int = 0,
        return_text: bool = True,
    ) -> SampleResponse: ...

    async def compute_logprobs_async(self, prompt: ModelInput) -> list[float | None]:
        """`None` for the first token, then the logprob of each following token."""
        ...


class TrainingClient(Protocol):
    def get_tokenizer(self) -> Any: ...

    async def forward_backward_async(
        self, data: list[Datum], loss_fn: str = "cross_entropy"
    ) -> Awaitable[ForwardBackwardOutput]: ...

    async def optim_step_async(self, adam_params: AdamParams) -> Awaitable[OptimStepResponse]: ...

    async def save_state_async(self, name: str) -> Awaitable[SaveWeightsResponse]: ...

    async def load_state_with_optimizer_async(self, path: str) -> Awaitable[Any]: ...

    async def save_weights_for_sampler_async(
        self, name: str
    ) -> Awaitable[SaveWeightsForSamplerResponse]: ...

    async def save_weights_and_get_sampling_client_async(self) -> SamplingClient: ...


class ServiceClient(Protocol):
    async def create_lora_training_client_async(
        self, base_model: str, rank: int = 32, seed: int | None = None
    ) -> TrainingClient: ...

    async def create_sampling_client_async(
        self, base_model: str, model_path: str | None = None
    ) -> SamplingClient: ...
