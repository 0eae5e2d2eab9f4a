"""A fake of the remote Tinker service, for tests that cannot reach the real one.

It stands in for `tinker.ServiceClient` and the training and sampling clients it makes,
with the SDK's signatures for the calls the `tinker` backend makes. Each call first builds
the request Tinker's SDK would send, with the SDK's own request types (CreateModelRequest
and LoraConfig, ForwardBackwardRequest through the SDK's wire encoder, OptimStepRequest,
SaveWeightsRequest, SaveWeightsForSamplerRequest, LoadWeightsRequest,
CreateSamplingSessionRequest, SampleRequest), so an argument the SDK would refuse is
refused here too. What Tinker's server refuses (a LoRA rank over the model's maximum, a
loss without the inputs it reads, a checkpoint name taken, an unknown checkpoint) fails
with the SDK's error type for that HTTP status. Results come as the SDK's futures, and a
failure surfaces when the future is awaited, as it does from the SDK's background thread.

A toy model (`tests/fakes/model.py`) samples and scores (with the top-k prompt logprobs
its bigram table gives, as Tinker's dense `TopkLogprobs`); training changes its weights as
a function of the data, and a state loads back exactly. The losses are the engine's own
definitions (Tinker's) and Tinker's cross_entropy, -sum weights * logprob of the targets
(one per position, or k with 2-D targets and weights), so `loss:sum` is the real loss of
the batch; each forward_backward also records its gradient with respect to the bigram
logits, in float64. Every accepted request is recorded. Not served: the other losses.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx
import numpy as np
import pytest
import tinker
import torch
from tinker import types
from tinker.lib.public_interfaces.api_future import AwaitableConcurrentFuture
from tinker.proto.request_conv import forward_backward_request_to_proto
from tinker.types import ParsedCheckpointTinkerPath
from tinker.types.topk_logprobs import MASK_LOGPROB, TopkLogprobs

from kernel.spec.loop import LOSS_OPTIONS
from tests.fakes import model
from worker.engine.backends.local.losses import LOSSES

T = TypeVar("T")
MAX_LORA_RANK = 32
"""Tinker caps the LoRA rank per model (32 for its MoE models); the fake's models share one cap."""
POLICY_INPUTS = ("target_tokens", "logprobs", "advantages")
MIN_TTL_SECONDS, MAX_TTL_SECONDS = 3600, 10 * 365 * 24 * 3600
"""A checkpoint's time to live: 1 hour to 10 years, as the SDK documents."""


@dataclass(frozen=True)
class Call:
    """One accepted request: what it does, the SDK request that carried it, and (for a
    forward-backward pass) what the service answered."""

    name: str
    request: Any
    result: Any = None
    weights: str | None = None
    """The weights of the sampler that answered a sample (a teacher's, or the student's),
    or those a forward_backward ran on."""
    gradient: np.ndarray | None = None
    """A forward_backward's: d loss:sum / d the bigram logits of `weights`, [VOCAB, VOCAB]."""


@dataclass(frozen=True)
class Checkpoint:
    base_model: str
    rank: int
    optimizer_steps: int
    weights: str


def completed(work: Callable[[], T]) -> tinker.APIFuture[T]:
    """The SDK's future of `work`'s result; its error is raised where the future is awaited."""
    try:
        result = work()
    except Exception as error:
        return failed(error)
    future: Future[T] = Future()
    future.set_result(result)
    return AwaitableConcurrentFuture(future)


def failed(error: Exception) -> tinker.APIFuture[Any]:
    """The SDK's future of a request that failed with `error`."""
    future: Future[Any] = Future()
    future.set_exception(error)
    return AwaitableConcurrentFuture(future)


def refused(
    error: type[tinker.APIStatusError], detail: str, status: int | None = None
) -> tinker.APIStatusError:
    """The SDK's error for the server's answer `detail` with an HTTP status: `error`'s own
    (BadRequestError: 400, ...), or `status` for a type that spans several (5xx)."""
    status = status or error.status_code
    body = {"detail": detail}
    response = httpx.Response(status, json=body, request=httpx.Request("POST", "https://fake"))
    return error(f"Error code: {status} - {body}", response=response, body=body)


def base_weights(base_model: str) -> str:
    """A base model's weights; a fresh LoRA (B = 0) leaves them unchanged."""
    return model.digest("base", base_model)


def checkpoint_kind(path: str) -> str | None:
    """`training` or `sampler` for a well-formed tinker:// path, else None."""
    try:
        return ParsedCheckpointTinkerPath.from_tinker_path(path).checkpoint_type
    except ValueError:
        return None


class FakeServiceClient:
    """Stands in for `tinker.ServiceClient`; `calls` records every accepted request."""

    def __init__(self, *, max_lora_rank: int = MAX_LORA_RANK) -> None:
        self.max_lora_rank = max_lora_rank
        self.session_id = "fake-session"
        self.calls: list[Call] = []
        self.checkpoints: dict[str, Checkpoint] = {}
        self.model_ids = itertools.count()
        self.sampler_ids = itertools.count()

    def record(
        self,
        name: str,
        request: Any,
        result: Any = None,
        weights: str | None = None,
        gradient: np.ndarray | None = None,
    ) -> None:
        self.calls.append(Call(name, request, result, weights, gradient))

    def calls_named(self, name: str) -> list[Call]:
        return [call for call in self.calls if call.name == name]

    def create_lora_training_client(
        self,
        base_model: str,
        rank: int = 32,
        seed: int | None = None,
        train_mlp: bool = True,
        train_attn: bool = True,
        train_unembed: bool = True,
        user_metadata: dict[str, str] | None = None,
        optimizer: types.OptimizerConfig | None = None,
    ) -> tinker.APIFuture[FakeTrainingClient]:
        def create() -> FakeTrainingClient:
            request = types.CreateModelRequest(
                session_id=self.session_id,
                model_seq_id=next(self.model_ids),
                base_model=base_model,
                lora_config=types.LoraConfig(
                    rank=rank,
                    seed=seed,
                    train_mlp=train_mlp,
                    train_attn=train_attn,
                    train_unembed=train_unembed,
                ),
                user_metadata=user_metadata,
                optimizer_config=optimizer or types.AdamOptimizerConfig(),
            )
            if not 0 < rank <= self.max_lora_rank:
                raise refused(
                    tinker.BadRequestError,
                    f"Lora_config.rank {rank} is outside 1..{self.max_lora_rank}, the LoRA "
                    f"ranks of model {base_model}",
                )
            self.record("create_model", request)
            return FakeTrainingClient(
                self, f"run-{request.model_seq_id}", base_model, rank, base_weights(base_model)
            )

        return completed(create)

    def create_training_client_from_state_with_optimizer(
        self,
        path: str,
        base_model: str | None = None,
        user_metadata: dict[str, str] | None = None,
        weights_access_token: str | None = None,
    ) -> tinker.APIFuture[FakeTrainingClient]:
        return self.from_state(path, base_model, user_metadata, weights_access_token, True)

    def create_training_client_from_state(
        self,
        path: str,
        base_model: str | None = None,
        user_metadata: dict[str, str] | None = None,
        weights_access_token: str | None = None,
        optimizer: types.OptimizerConfig | None = None,
    ) -> tinker.APIFuture[FakeTrainingClient]:
        """The state's weights with a fresh optimizer (its step count 0)."""
        return self.from_state(path, base_model, user_metadata, weights_access_token, False)

    def from_state(
        self,
        path: str,
        base_model: str | None,
        user_metadata: dict[str, str] | None,
        weights_access_token: str | None,
        with_optimizer: bool,
    ) -> tinker.APIFuture[FakeTrainingClient]:
        def load() -> FakeTrainingClient:
            request = types.LoadWeightsRequest(
                session_id=self.session_id,
                model_seq_id=next(self.model_ids),
                base_model=base_model,
                user_metadata=user_metadata,
                path=path,
                optimizer=with_optimizer,
                weights_access_token=weights_access_token,
            )
            saved = self.checkpoints.get(path) if checkpoint_kind(path) == "training" else None
            if saved is None:
                raise refused(tinker.NotFoundError, f"no training state at {path}")
            if base_model not in (None, saved.base_model):
                raise refused(
                    tinker.BadRequestError,
                    f"the state at {path} is of {saved.base_model}, not {base_model}",
                )
            self.record("load_state", request)
            return FakeTrainingClient(
                self,
                f"run-{request.model_seq_id}",
                saved.base_model,
                saved.rank,
                saved.weights,
                saved.optimizer_steps if with_optimizer else 0,
            )

        return completed(load)

    def create_sampling_client(
        self,
        model_path: str | None = None,
        base_model: str | None = None,
        retry_config: Any = None,
        record_stability_info: bool = False,
    ) -> tinker.APIFuture[FakeSamplingClient]:
        if model_path is None and base_model is None:
            raise ValueError("Either model_path or base_model must be provided")

        def create() -> FakeSamplingClient:
            request = types.CreateSamplingSessionRequest(
                session_id=self.session_id,
                sampling_session_seq_id=next(self.sampler_ids),
                base_model=base_model,
                model_path=model_path,
            )
            if model_path is None:
                name, weights = str(base_model), base_weights(str(base_model))
            else:
                saved = self.checkpoints.get(model_path)
                if checkpoint_kind(model_path) != "sampler" or saved is None:
                    raise refused(tinker.NotFoundError, f"no sampler weights at {model_path}")
                if base_model not in (None, saved.base_model):
                    raise refused(
                        tinker.BadRequestError,
                        f"the weights at {model_path} are of {saved.base_model}, not {base_model}",
                    )
                name, weights = saved.base_model, saved.weights
            self.record("create_sampler", request)
            return FakeSamplingClient(self, name, weights)

        return completed(create)


@dataclass
class FakeTrainingClient:
    service: FakeServiceClient
    model_id: str
    base_model: str
    rank: int
    weights: str
    optimizer_steps: int = 0
    gradients: list[str] = field(default_factory=list)
    seq_ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def get_tokenizer(self) -> Any:
        return model.TOKENIZER

    def get_info(self) -> types.GetInfoResponse:
        return types.GetInfoResponse(
            model_data=types.ModelData(model_name=self.base_model),
            model_id=self.model_id,
            is_lora=True,
            lora_rank=self.rank,
        )

    def forward_backward(
        self,
        data: list[types.Datum],
        loss_fn: types.LossFnType,
        loss_fn_config: dict[str, float | str] | None = None,
    ) -> tinker.APIFuture[types.ForwardBackwardOutput]:
        if not data:
            raise ValueError("No data provided")

        def run() -> types.ForwardBackwardOutput:
            request = types.ForwardBackwardRequest(
                forward_backward_input=types.ForwardBackwardInput(
                    data=data, loss_fn=loss_fn, loss_fn_config=loss_fn_config
                ),
                model_id=self.model_id,
                seq_id=next(self.seq_ids),
            )
            forward_backward_request_to_proto(request)
            if loss_fn != "cross_entropy" and loss_fn not in LOSSES:
                raise refused(tinker.BadRequestError, f"the fake serves no loss {loss_fn!r}")
            options = LOSS_OPTIONS.get(loss_fn, {}) | dict(loss_fn_config or {})
            outputs, loss = [], 0.0
            logits = torch.tensor(model.log_probs(self.weights), requires_grad=True)
            for index, datum in enumerate(data):
                if loss_fn == "cross_entropy":
                    tokens, inputs = cross_entropy_inputs(datum, index)
                    datum_loss, scores = cross_entropy(self.weights, tokens, inputs)
                else:
                    tokens, inputs = policy_inputs(datum, index)
                    datum_loss, scores = policy_loss(self.weights, tokens, inputs, loss_fn, options)
                loss += datum_loss
                outputs.append({"logprobs": types.TensorData.from_numpy(scores)})
                self.gradients.append(model.digest(loss_fn, options, tokens, datum_values(inputs)))
                exact_loss(logits, loss_fn, options, tokens, inputs).backward()
            output = types.ForwardBackwardOutput(
                loss_fn_output_type="ArrayRecord",
                loss_fn_outputs=outputs,
                metrics={"loss:sum": loss},
            )
            assert logits.grad is not None
            gradient = logits.grad.numpy()
            self.service.record("forward_backward", request, output, self.weights, gradient)
            return output

        return completed(run)

    def optim_step(
        self,
        optim_params: types.OptimParams | None = None,
        *,
        adam_params: types.AdamParams | None = None,
    ) -> tinker.APIFuture[types.OptimStepResponse]:
        if optim_params is not None and adam_params is not None:
            raise ValueError("Specify optim_params or legacy adam_params, not both")
        params = optim_params if optim_params is not None else adam_params
        if not isinstance(params, types.AdamParams):
            raise TypeError("Expected AdamParams (the fake's runs use AdamW)")

        def step() -> types.OptimStepResponse:
            request = types.OptimStepRequest(
                optim_params=params, model_id=self.model_id, seq_id=next(self.seq_ids)
            )
            update = model.digest(self.gradients, params.model_dump())
            self.weights = model.trained(self.weights, update)
            self.gradients = []
            self.optimizer_steps += 1
            self.service.record("optim_step", request)
            return types.OptimStepResponse(metrics={})

        return completed(step)

    def store(self, kind: str, name: str, ttl_seconds: int | None, overwrite: bool) -> str:
        """Keep the current weights under `name` in this run."""
        if ttl_seconds is not None and not MIN_TTL_SECONDS <= ttl_seconds <= MAX_TTL_SECONDS:
            raise refused(tinker.BadRequestError, f"ttl_seconds {ttl_seconds} is out of range")
        path = f"tinker://{self.model_id}/{kind}/{name}"
        if checkpoint_kind(path) is None:
            raise refused(tinker.BadRequestError, f"{name!r} is not a checkpoint name")
        if path in self.service.checkpoints and not overwrite:
            raise refused(
                tinker.ConflictError,
                f"checkpoint {name!r} already exists in training run {self.model_id}",
            )
        self.service.checkpoints[path] = Checkpoint(
            self.base_model, self.rank, self.optimizer_steps, self.weights
        )
        return path

    def save_state(
        self,
        name: str,
        ttl_seconds: int | None = None,
        overwrite: bool = False,
        user_metadata: dict[str, str] | None = None,
    ) -> tinker.APIFuture[types.SaveWeightsResponse]:
        def save() -> types.SaveWeightsResponse:
            request = types.SaveWeightsRequest(
                model_id=self.model_id,
                path=name,
                seq_id=next(self.seq_ids),
                ttl_seconds=ttl_seconds,
                overwrite=overwrite,
                user_metadata=user_metadata,
            )
            path = self.store("weights", name, ttl_seconds, overwrite)
            self.service.record("save_state", request)
            return types.SaveWeightsResponse(path=path)

        return completed(save)

    def save_weights_for_sampler(
        self,
        name: str,
        ttl_seconds: int | None = None,
        user_metadata: dict[str, str] | None = None,
    ) -> tinker.APIFuture[types.SaveWeightsForSamplerResponse]:
        def save() -> types.SaveWeightsForSamplerResponse:
            request = types.SaveWeightsForSamplerRequest(
                model_id=self.model_id,
                path=name,
                seq_id=next(self.seq_ids),
                ttl_seconds=ttl_seconds,
                user_metadata=user_metadata,
            )
            path = self.store("sampler_weights", name, ttl_seconds, overwrite=True)
            self.service.record("save_weights_for_sampler", request)
            return types.SaveWeightsForSamplerResponse(path=path)

        return completed(save)

    def save_weights_and_get_sampling_client(
        self,
        name: str | None = None,
        retry_config: Any = None,
        record_stability_info: bool = False,
        kind: types.SamplingClientKind = "snapshot",
    ) -> tinker.APIFuture[FakeSamplingClient]:
        def snapshot() -> FakeSamplingClient:
            request = types.SaveWeightsForSamplerRequest(
                model_id=self.model_id,
                seq_id=next(self.seq_ids),
                sampling_session_seq_id=next(self.service.sampler_ids),
                kind=kind,
            )
            self.service.record("save_weights_and_get_sampling_client", request)
            return FakeSamplingClient(self.service, self.base_model, self.weights)

        return completed(snapshot)

    def create_sampling_client(
        self,
        model_path: str,
        retry_config: Any = None,
        record_stability_info: bool = False,
    ) -> tinker.APIFuture[FakeSamplingClient]:
        return self.service.create_sampling_client(model_path=model_path)


def policy_inputs(datum: types.Datum, index: int) -> tuple[list[int], dict[str, np.ndarray]]:
    """The model input's tokens and the loss inputs a policy loss reads, each one value per
    token, as Tinker documents them; the server refuses a datum that lacks them."""
    tokens = datum.model_input.to_ints()
    inputs = {}
    for name in POLICY_INPUTS:
        tensor = datum.loss_fn_inputs.get(name)
        if tensor is None:
            raise refused(tinker.BadRequestError, f"datum {index} has no loss input {name!r}")
        inputs[name] = tensor.to_numpy()
        if inputs[name].shape != (len(tokens),):
            raise refused(
                tinker.BadRequestError,
                f"datum {index}: {name} has shape {list(inputs[name].shape)}, its model input "
                f"{len(tokens)} tokens",
            )
    targets = inputs["target_tokens"]
    if targets.dtype != np.int64 or ((targets < 0) | (targets >= model.VOCAB)).any():
        raise refused(tinker.BadRequestError, f"datum {index}: target_tokens are not token ids")
    return tokens, inputs


def cross_entropy_inputs(datum: types.Datum, index: int) -> tuple[list[int], dict[str, np.ndarray]]:
    """Tinker's cross_entropy inputs: target_tokens and weights, both [N] or both [N, K]
    for a model input of N tokens (K targets per position: top-k distillation)."""
    tokens = datum.model_input.to_ints()
    inputs = {}
    for name in ("target_tokens", "weights"):
        tensor = datum.loss_fn_inputs.get(name)
        if tensor is None:
            raise refused(tinker.BadRequestError, f"datum {index} has no loss input {name!r}")
        inputs[name] = tensor.to_numpy()
    targets, weights = inputs["target_tokens"], inputs["weights"]
    if targets.shape != weights.shape or targets.ndim not in (1, 2) or len(targets) != len(tokens):
        raise refused(
            tinker.BadRequestError,
            f"datum {index}: target_tokens {list(targets.shape)} and weights "
            f"{list(weights.shape)} must both be [{len(tokens)}] or [{len(tokens)}, K]",
        )
    if targets.dtype != np.int64 or ((targets < 0) | (targets >= model.VOCAB)).any():
        raise refused(tinker.BadRequestError, f"datum {index}: target_tokens are not token ids")
    if weights.dtype != np.float32 or not np.isfinite(weights).all():
        raise refused(tinker.BadRequestError, f"datum {index}: weights must be finite float32")
    return tokens, inputs


def cross_entropy(
    weights: str, tokens: list[int], inputs: dict[str, np.ndarray]
) -> tuple[float, np.ndarray]:
    """(-sum weights * logprob of the targets, the targets' logprobs in their shape)."""
    targets = inputs["target_tokens"]
    rows = np.asarray(tokens).reshape((-1,) + (1,) * (targets.ndim - 1))
    logprobs = model.log_probs(weights)[rows, targets].astype(np.float32)
    return float(-(inputs["weights"] * logprobs).sum()), logprobs


def policy_loss(
    weights: str,
    tokens: list[int],
    inputs: dict[str, np.ndarray],
    loss_fn: str,
    options: dict[str, float],
) -> tuple[float, np.ndarray]:
    """(the policy loss summed over the datum's positions, the targets' logprobs)."""
    logprobs = model.target_logprobs(weights, tokens, inputs["target_tokens"])
    tensors = {name: torch.from_numpy(value) for name, value in inputs.items()}
    per_token = LOSSES[loss_fn](torch.tensor(logprobs), tensors, options)
    return float(per_token.sum()), np.asarray(logprobs, dtype=np.float32)


def exact_loss(
    logits: torch.Tensor,
    loss_fn: str,
    options: dict[str, float],
    tokens: list[int],
    inputs: dict[str, np.ndarray],
) -> torch.Tensor:
    """A datum's loss in float64 as a function of the bigram logits (each row's
    log-softmax is the model's table), for its gradient."""
    table = logits.log_softmax(-1)
    targets = torch.from_numpy(inputs["target_tokens"])
    rows = torch.tensor(tokens).reshape((-1,) + (1,) * (targets.dim() - 1))
    logprobs = table[rows, targets]
    tensors = {name: torch.from_numpy(value).double() for name, value in inputs.items()}
    if loss_fn == "cross_entropy":
        return -(tensors["weights"] * logprobs).sum()
    return LOSSES[loss_fn](logprobs, tensors, options).sum()


def datum_values(inputs: dict[str, np.ndarray]) -> dict[str, list[float]]:
    return {name: value.tolist() for name, value in sorted(inputs.items())}


@dataclass
class FakeSamplingClient:
    service: FakeServiceClient
    base_model: str
    weights: str

    def get_tokenizer(self) -> Any:
        return model.TOKENIZER

    def sample(
        self,
        prompt: types.ModelInput,
        num_samples: int,
        sampling_params: types.SamplingParams,
        include_prompt_logprobs: bool = False,
        topk_prompt_logprobs: int = 0,
    ) -> tinker.APIFuture[types.SampleResponse]:
        return completed(
            lambda: self.respond(
                prompt, num_samples, sampling_params, include_prompt_logprobs, topk_prompt_logprobs
            )
        )

    def compute_logprobs(self, prompt: types.ModelInput) -> tinker.APIFuture[list[float | None]]:
        """As the SDK asks it: a one-token sample that returns the prompt's logprobs."""
        one_token = types.SamplingParams(max_tokens=1)
        return completed(lambda: self.respond(prompt, 1, one_token, True).prompt_logprobs)

    def respond(
        self,
        prompt: types.ModelInput,
        num_samples: int,
        params: types.SamplingParams,
        include_prompt_logprobs: bool,
        topk_prompt_logprobs: int = 0,
    ) -> types.SampleResponse:
        request = types.SampleRequest(
            sampling_session_id=self.service.session_id,
            seq_id=len(self.service.calls),
            num_samples=num_samples,
            prompt=prompt,
            sampling_params=params,
            prompt_logprobs=include_prompt_logprobs,
            topk_prompt_logprobs=topk_prompt_logprobs,
        )
        tokens = request.prompt.to_ints()
        if not tokens or max(tokens) >= model.VOCAB or min(tokens) < 0:
            raise refused(tinker.BadRequestError, "the prompt must be token ids, at least one")
        if params.max_tokens is None or params.max_tokens < 1:
            raise refused(tinker.BadRequestError, "sampling_params.max_tokens must be positive")
        if request.topk_prompt_logprobs < 0:
            raise refused(tinker.BadRequestError, "topk_prompt_logprobs must be 0 or more")
        draws = model.sample(self.weights, tokens, num_samples, model.Sampling.of(params))
        sequences = [
            types.SampledSequence(
                stop_reason=draw.stop_reason,
                sequence_id=f"{request.seq_id}-{index}",
                tokens_np=np.asarray(draw.tokens, dtype=np.int32),
                logprobs_np=np.asarray(draw.logprobs, dtype=np.float32),
            )
            for index, draw in enumerate(draws)
        ]
        scored = model.score(self.weights, tokens) if include_prompt_logprobs else None
        k = request.topk_prompt_logprobs
        response = types.SampleResponse(
            sequences=sequences,
            prompt_logprobs_np=None
            if scored is None
            else np.asarray([np.nan if v is None else v for v in scored], dtype=np.float32),
            topk_prompt_logprobs_np=top_logprobs(self.weights, tokens, k) if k else None,
        )
        self.service.record("sample", request, response, self.weights)
        return response


def top_logprobs(weights: str, tokens: list[int], k: int) -> TopkLogprobs:
    """The k likeliest next tokens at each prompt position (the first has no context and
    is the sentinel row), likeliest first; past the vocabulary, sentinels, as Tinker pads."""
    token_ids = np.zeros((len(tokens), k), dtype=np.int32)
    logprobs = np.full((len(tokens), k), MASK_LOGPROB, dtype=np.float32)
    for position, row in enumerate(model.likeliest(weights, tokens, k)[1:], start=1):
        assert row is not None
        token_ids[position, : len(row)] = [token for token, _ in row]
        logprobs[position, : len(row)] = [value for _, value in row]
    return TopkLogprobs(token_ids=token_ids, logprobs=logprobs)


def patch_tinker(monkeypatch: pytest.MonkeyPatch, fake: FakeServiceClient) -> None:
    """Let `connect_tinker` find `fake`: a key in the environment, and a ServiceClient
    that is the fake."""
    monkeypatch.setenv("TINKER_API_KEY", "tml-fake-key")
    monkeypatch.setattr(tinker, "ServiceClient", lambda: fake)
