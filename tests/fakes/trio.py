"""A fake of the remote PyTRIO service, for tests that cannot reach the real one.

It is shaped like `pytrio.ServiceClient` and its training and sampling clients, takes and
returns PyTRIO's own types, and runs every request through PyTRIO's own request code
(`plan_training_batch`, the trainer payload builders, `build_sample_request`, the LoRA
rank check), so a request the real service would reject is rejected here too. A toy model
(`tests/fakes/model.py`) samples and scores; training changes its weights as a function of
the data, so a state saved and loaded continues exactly. Every accepted call is recorded.
Its REST client (`trio_rest.py`) lists the checkpoints it saved and serves their archives.
"""

from __future__ import annotations

import asyncio
import itertools
import math
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest
import pytrio
from pytrio.client.builders.sampling import actor_sample_response_to_sdk, build_sample_request
from pytrio.client.builders.training import (
    build_trainer_forward_payload,
    build_trainer_optimize_payload,
    build_trainer_save_payload,
)
from pytrio.client.training_batch import (
    PolicyTrainingSample,
    TrainingSample,
    plan_training_batch,
)
from pytrio.config.config import Configuration, auth_state, configuration
from pytrio.errors.base import ValidationError
from pytrio.model.limits import TrainingLimits
from pytrio.protocol.actor.sampling_run.sample import (
    ActorSampleResponse,
    ActorSampleSequence,
    SampleRequest,
    Usage,
)
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
    TensorData,
)

from tests.fakes import model
from tests.fakes.trio_rest import FakeRestClient

TRAINING_LIMITS = TrainingLimits(
    max_batch_size=64, max_tokens_per_request=16_384, max_seq_len=8_192
)


@dataclass(frozen=True)
class Call:
    """One accepted request: the method's name and its (validated) arguments."""

    name: str
    args: dict[str, Any]


@dataclass(frozen=True)
class Checkpoint:
    base_model: str
    rank: int
    optimizer_steps: int
    weights: str
    created_at: datetime = field(default_factory=lambda: datetime.now(UTC))


def require(value: Any, kind: type, name: str) -> None:
    """PyTRIO's types are the currency: anything else is a caller bug."""
    if not isinstance(value, kind):
        raise TypeError(f"{name} must be a {kind.__name__}, got {type(value).__name__}")


def base_weights(base_model: str) -> str:
    """A base model's weights; a fresh LoRA (B = 0) leaves them unchanged."""
    return model.digest("base", base_model)


def datum_digest(datum: Datum) -> str:
    inputs = {key: value.data for key, value in sorted(datum.loss_fn_inputs.items())}
    return model.digest(datum.model_input.to_ints(), inputs)


class FakeServiceClient:
    """Stands in for `pytrio.ServiceClient`; `calls` records every accepted request.

    `tokenizers` maps a base model to its tokenizer (default: the tiny byte tokenizer);
    `drop_last_logprob` makes compute_logprobs omit the last position, as a server that
    leaves positions out would; `latency` is the seconds each training or sampling request
    takes, as a remote service's round trip and compute would (benchmarks/fleet.py).
    """

    def __init__(
        self,
        api_key: str | None = None,
        *,
        tokenizers: dict[str, Any] | None = None,
        drop_last_logprob: bool = False,
        limits: TrainingLimits = TRAINING_LIMITS,
        latency: float = 0.0,
    ) -> None:
        self.tokenizers = tokenizers or {}
        self.latency = latency
        self.drop_last_logprob = drop_last_logprob
        self.limits = limits
        self.calls: list[Call] = []
        self.checkpoints: dict[str, Checkpoint] = {}
        self.run_ids = itertools.count()

    def record(self, call: str, /, **args: Any) -> None:
        self.calls.append(Call(call, args))

    async def answer(self) -> None:
        """Wait as long as a remote request takes."""
        if self.latency:
            await asyncio.sleep(self.latency)

    def calls_named(self, name: str) -> list[Call]:
        return [call for call in self.calls if call.name == name]

    def tokenizer_for(self, base_model: str) -> Any:
        return self.tokenizers.get(base_model, model.TOKENIZER)

    def create_rest_client(self) -> FakeRestClient:
        """PyTRIO's REST client: lists what this fake saved and serves its archives."""
        return FakeRestClient(self)

    async def create_lora_training_client_async(
        self,
        base_model: str,
        rank: int = 32,
        seed: int | None = None,
        train_mlp: bool = True,
        train_attn: bool = True,
        train_unembed: bool = True,
    ) -> FakeTrainingClient:
        if rank not in range(4, 65):
            raise ValidationError(
                f"rank must be in [4, 64]. Got {rank}", code="validation.invalid_lora_rank"
            )
        self.record("create_lora_training_client", base_model=base_model, rank=rank, seed=seed)
        return FakeTrainingClient(
            self, base_model, rank, f"run-{next(self.run_ids)}", base_weights(base_model)
        )

    async def create_sampling_client_async(
        self, base_model: str, model_path: str | None = None
    ) -> FakeSamplingClient:
        weights = base_weights(base_model)
        if model_path is not None:
            saved = self.checkpoints.get(model_path)
            if saved is None or saved.base_model != base_model:
                raise ValidationError(
                    f"no weights of {base_model} at {model_path}", code="validation.not_found"
                )
            weights = saved.weights
        self.record("create_sampling_client", base_model=base_model, model_path=model_path)
        return FakeSamplingClient(self, base_model, weights)


@dataclass
class FakeTrainingClient:
    service: FakeServiceClient
    base_model: str
    rank: int
    run_id: str
    weights: str
    optimizer_steps: int = 0
    started: bool = False
    gradients: list[str] = field(default_factory=list)

    def get_tokenizer(self) -> Any:
        return self.service.tokenizer_for(self.base_model)

    async def forward_backward_async(
        self,
        data: list[Datum],
        loss_fn: str = "cross_entropy",
        loss_fn_config: dict[str, object] | None = None,
        auto_shift: bool = False,
    ) -> APIFuture[ForwardBackwardOutput]:
        await self.service.answer()
        require(data, list, "data")
        for datum in data:
            require(datum, Datum, "each datum")
        plan = plan_training_batch(
            data,
            loss_fn=loss_fn,
            auto_shift=auto_shift,
            limits=self.service.limits,
            tokenizer_vocab_size=len(self.get_tokenizer()),
        )
        for chunk in plan.chunks:
            build_trainer_forward_payload(chunk, loss_fn_config, auto_shift, plan.totals)
        self.started = True
        self.gradients.append(
            model.digest(loss_fn, loss_fn_config, [datum_digest(d) for d in data])
        )
        self.service.record(
            "forward_backward", data=data, loss_fn=loss_fn, loss_fn_config=loss_fn_config, plan=plan
        )
        samples = [sample for chunk in plan.chunks for sample in chunk.samples]
        # At the sampled weights the importance ratio is 1, so the policy loss is -sum(A);
        # cross entropy is scored against a uniform model.
        loss_sum = sum(
            -sum(sample.advantages)
            if isinstance(sample, PolicyTrainingSample)
            else len(sample.target_tokens) * math.log(len(self.get_tokenizer()))
            for sample in samples
        )
        tokens = plan.totals.total_active_tokens
        return APIFuture.completed(
            ForwardBackwardOutput(
                loss_fn_outputs=[
                    {"logprobs": TensorData(data=self.logprobs(s), dtype="float32")}
                    for s in samples
                ],
                metrics={
                    "loss_sum": loss_sum,
                    "loss_mean": loss_sum / max(tokens, 1),
                    "token_count": tokens,
                },
            )
        )

    def logprobs(self, sample: TrainingSample) -> list[float]:
        inputs = sample.model_input.to_ints()
        return model.target_logprobs(self.weights, inputs, list(sample.target_tokens))

    async def optim_step_async(self, adam_params: AdamParams) -> APIFuture[OptimStepResponse]:
        await self.service.answer()
        require(adam_params, AdamParams, "adam_params")
        build_trainer_optimize_payload(adam_params)
        self.started = True
        self.weights = model.trained(self.weights, model.digest(self.gradients, adam_params))
        self.gradients.clear()
        self.optimizer_steps += 1
        self.service.record("optim_step", adam_params=adam_params)
        return APIFuture.completed(OptimStepResponse(metrics={}))

    def save(self, kind: str, name: str, ttl_seconds: int | None, overwrite: bool) -> str:
        payload = build_trainer_save_payload(name, ttl_seconds, overwrite=overwrite)
        path = f"trio://fake/{self.run_id}/{kind}/{payload.name}"
        if path in self.service.checkpoints and not overwrite:
            raise ValidationError(
                f"checkpoint {payload.name!r} already exists in this training run",
                code="validation.checkpoint_exists",
            )
        self.service.checkpoints[path] = Checkpoint(
            self.base_model, self.rank, self.optimizer_steps, self.weights
        )
        self.service.record(
            f"save_{kind}", name=name, path=path, optimizer_steps=self.optimizer_steps
        )
        return path

    async def save_state_async(
        self, name: str, ttl_seconds: int | None = None, overwrite: bool = False
    ) -> APIFuture[SaveWeightsResponse]:
        await self.service.answer()
        path = self.save("state", name, ttl_seconds, overwrite)
        return APIFuture.completed(SaveWeightsResponse(path=path, model=self.base_model, size=1))

    async def save_weights_for_sampler_async(
        self, name: str, ttl_seconds: int | None = None
    ) -> APIFuture[SaveWeightsForSamplerResponse]:
        await self.service.answer()
        path = self.save("weights", name, ttl_seconds, overwrite=True)
        return APIFuture.completed(
            SaveWeightsForSamplerResponse(path=path, model=self.base_model, size=1)
        )

    async def save_weights_and_get_sampling_client_async(self) -> FakeSamplingClient:
        await self.service.answer()
        self.started = True
        self.service.record("refresh_sampler", optimizer_steps=self.optimizer_steps)
        return FakeSamplingClient(self.service, self.base_model, self.weights, self.optimizer_steps)

    async def create_sampling_client_async(self, model_path: str) -> FakeSamplingClient:
        """PyTRIO opens a sampling run of this training run's base model on saved weights."""
        saved = self.service.checkpoints.get(model_path)
        if saved is None or saved.base_model != self.base_model:
            raise ValidationError(
                f"no weights of {self.base_model} at {model_path}", code="validation.not_found"
            )
        self.service.record(
            "create_sampling_client", base_model=self.base_model, model_path=model_path
        )
        return FakeSamplingClient(
            self.service, self.base_model, saved.weights, saved.optimizer_steps
        )

    async def load_state_with_optimizer_async(self, path: str) -> APIFuture[dict[str, Any]]:
        return self.load(path, with_optimizer=True)

    async def load_state_async(self, path: str) -> APIFuture[dict[str, Any]]:
        """The state's weights only: the optimizer starts fresh (its step count 0)."""
        return self.load(path, with_optimizer=False)

    def load(self, path: str, *, with_optimizer: bool) -> APIFuture[dict[str, Any]]:
        if self.started:
            raise ValidationError(
                "load_state cannot be called after training has started. "
                "Call load_state before the first training operation.",
                code="validation.already_initialized",
            )
        saved = self.service.checkpoints.get(path)
        if saved is None:
            raise ValidationError(f"no checkpoint at {path}", code="validation.not_found")
        if (saved.base_model, saved.rank) != (self.base_model, self.rank):
            raise ValidationError(
                "Checkpoint configuration is incompatible",
                code="validation.checkpoint_config_mismatch",
            )
        self.started = True
        self.weights = saved.weights
        self.optimizer_steps = saved.optimizer_steps if with_optimizer else 0
        name = "load_state_with_optimizer" if with_optimizer else "load_state"
        self.service.record(name, path=path)
        return APIFuture.completed({})


@dataclass
class FakeSamplingClient:
    service: FakeServiceClient
    base_model: str
    weights: str
    version: int = 0
    """The optimizer steps the weights had taken when the sampler was made."""

    def get_tokenizer(self) -> Any:
        return self.service.tokenizer_for(self.base_model)

    async def sample_async(
        self,
        prompt: ModelInput,
        num_samples: int = 1,
        sampling_params: SamplingParams = SamplingParams(),  # noqa: B008 - immutable default
        include_prompt_logprobs: bool = False,
        topk_prompt_logprobs: int = 0,
        return_text: bool = True,
    ) -> SampleResponse:
        await self.service.answer()
        request = validated_request(
            prompt,
            num_samples,
            sampling_params,
            include_prompt_logprobs,
            topk_prompt_logprobs,
            return_text,
        )
        tokens = prompt.to_ints()
        draws = model.sample(self.weights, tokens, num_samples, model.Sampling.of(sampling_params))
        tokenizer = self.get_tokenizer()
        sequences = [
            ActorSampleSequence(
                tokens=draw.tokens,
                logprobs=draw.logprobs,
                text=tokenizer.decode(draw.tokens) if return_text else None,
                stop_reason=draw.stop_reason,
            )
            for draw in draws
        ]
        response = actor_sample_response_to_sdk(
            ActorSampleResponse(
                sequences=sequences,
                prompt_logprobs=self.prompt_logprobs(tokens) if include_prompt_logprobs else None,
                topk_prompt_logprobs=model.likeliest(self.weights, tokens, topk_prompt_logprobs)
                if topk_prompt_logprobs
                else None,
                usage=Usage(
                    input_tokens=len(tokens), output_tokens=sum(len(s.tokens) for s in sequences)
                ),
            )
        )
        self.service.record(
            "sample", request=request, weights=self.weights, version=self.version, response=response
        )
        return response

    async def compute_logprobs_async(self, prompt: ModelInput) -> list[float | None]:
        """PyTRIO sends this as a one-token sample that asks for the prompt's logprobs."""
        await self.service.answer()
        request = validated_request(prompt, 1, SamplingParams(max_tokens=1), True, 0, False)
        self.service.record("compute_logprobs", request=request, weights=self.weights)
        return self.prompt_logprobs(prompt.to_ints())

    def prompt_logprobs(self, tokens: list[int]) -> list[float | None]:
        """None for the first token (it has no context), then one logprob per token."""
        logprobs = model.score(self.weights, tokens)
        if self.service.drop_last_logprob:
            logprobs[-1] = None
        return logprobs


def validated_request(
    prompt: ModelInput,
    num_samples: int,
    params: SamplingParams,
    include_prompt_logprobs: bool,
    topk_prompt_logprobs: int,
    return_text: bool,
) -> SampleRequest:
    """The checks `SamplingClient._submit_sample` makes before anything is sent."""
    require(prompt, ModelInput, "prompt")
    require(params, SamplingParams, "sampling_params")
    if prompt.is_empty:
        raise ValidationError("prompt cannot be empty", code="validation.empty_prompt")
    if params.max_tokens is None or params.max_tokens <= 0:
        raise ValidationError(
            "sampling_params.max_tokens must be greater than 0",
            code="validation.invalid_sampling_request",
        )
    return build_sample_request(
        prompt,
        num_samples=num_samples,
        sampling_params=params,
        include_prompt_logprobs=include_prompt_logprobs,
        topk_prompt_logprobs=topk_prompt_logprobs,
        return_text=return_text,
        return_token_logprobs=True,
    )


def patch_pytrio(monkeypatch: pytest.MonkeyPatch, fake: FakeServiceClient) -> None:
    """Let `connect_trio` find `fake`: a logged-in PyTRIO whose ServiceClient is the fake.

    PyTRIO's process-wide configuration and login are restored after the test.
    """
    for name in Configuration.model_fields:
        monkeypatch.setattr(configuration, name, getattr(configuration, name))
    monkeypatch.setattr(auth_state, "api_key", "fake-key")
    monkeypatch.setattr(auth_state, "config_error", None)
    monkeypatch.setattr(pytrio, "ServiceClient", lambda: fake)
