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
- Logit-level objectives: forward_kl over the teacher's top k without a tail, the one
  Tinker's API trains exactly (`forward_backward_logits_async`): the datums carry the
  teacher's top k, and cross_entropy takes k targets and weights per position.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

import numpy as np
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
from kernel.spec import ObjectiveSpec, TinkerBackendSpec
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
POLICY_INPUTS = ("target_tokens", "logprobs", "advantages")
SCALED_LOSSES = ("importance_sampling", "ppo", "cispo")
"""The policy losses whose value scales with the advantages (c > 0 times the advantages is
c times the loss), so that dividing the advantages by n divides the loss by n exactly."""

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


def topk_refusal(objective: ObjectiveSpec, loss_fn: str) -> str | None:
    """Why Tinker cannot train `objective` (with `loss_fn` for the advantages) exactly,
    or None (the spec refuses these at submission too)."""
    if objective.kind != "forward_kl" or not objective.top_k or objective.keeps_tail:
        return (
            f"Tinker trains only forward_kl over the teacher's top-k without a tail bucket, "
            f"not {objective.kind} (top_k {objective.top_k}, tail {objective.keeps_tail})"
        )
    if loss_fn not in SCALED_LOSSES:
        return (
            f"the advantages' loss {loss_fn} does not scale with them, so it cannot be "
            f"divided by the completion positions: use one of {', '.join(SCALED_LOSSES)}"
        )
    return None


def completion_mask(datum: Datum, index: int) -> np.ndarray:
    """The positions the objective compares (`weights` 1), with the teacher's top k there."""
    length = datum.model_input.length
    inputs = datum.loss_fn_inputs
    if "weights" not in inputs or inputs["weights"].shape != [length]:
        raise BackendRejected(
            f"the backend rejected forward_backward_logits: datum {index} has no weights of "
            f"shape [{length}] marking its completion positions"
        )
    tokens, probs = inputs.get("teacher_tokens"), inputs.get("teacher_probs")
    if tokens is None or probs is None or len(tokens.shape) != 2 or tokens.shape != probs.shape:
        raise BackendRejected(
            f"the backend rejected forward_backward_logits: datum {index} carries no teacher "
            "top-k (teacher_tokens and teacher_probs, [length, k]): Tinker's trainer never "
            "sees the teacher, so its distribution must come with the datum"
        )
    if tokens.shape[0] != length:
        raise BackendRejected(
            f"the backend rejected forward_backward_logits: datum {index}'s teacher top-k has "
            f"{tokens.shape[0]} rows, its model input {length} tokens"
        )
    return inputs["weights"].to_numpy() == 1


def distilled(datum: Datum, scale: float) -> Datum:
    """cross_entropy over the teacher's top k: targets its tokens, weights `scale` times
    its probabilities (0 on the prompt), so the loss is -scale sum p log q_student."""
    inputs = datum.loss_fn_inputs
    weights = inputs["teacher_probs"].to_numpy().astype(np.float64) * scale
    return Datum(
        model_input=datum.model_input,
        loss_fn_inputs={
            "target_tokens": inputs["teacher_tokens"],
            "weights": TensorData.from_numpy(weights.astype(np.float32)),
        },
    )


def advantaged(datum: Datum, scale: float) -> Datum:
    """The policy loss's inputs alone, the advantages times `scale`."""
    inputs = {name: datum.loss_fn_inputs[name] for name in POLICY_INPUTS}
    advantages = inputs["advantages"].to_numpy().astype(np.float64) * scale
    inputs["advantages"] = TensorData.from_numpy(advantages.astype(np.float32))
    return Datum(model_input=datum.model_input, loss_fn_inputs=inputs)


def topk_metrics(
    data: list[Datum],
    masks: list[np.ndarray],
    student: list[np.ndarray],
    coef: float,
    policy_loss: float,
) -> dict[str, float]:
    """The local backend's metrics: `objective_mean`, sum_k p (log p - log q) over the kept
    tokens per completion position (q the student's logprobs Tinker returned);
    `teacher_mass_mean`, sum_k p; and the loss coef * objective + the policy loss per
    position (`policy_loss` is Tinker's, of advantages divided by the positions)."""
    objective = mass = 0.0
    for datum, mask, logprobs in zip(data, masks, student, strict=True):
        p = datum.loss_fn_inputs["teacher_probs"].to_numpy().astype(np.float64)[mask]
        q = logprobs.astype(np.float64)[mask]
        kept = p > 0
        objective += float((p[kept] * (np.log(p[kept]) - q[kept])).sum())
        mass += float(p.sum())
    positions = int(sum(mask.sum() for mask in masks))
    loss = coef * objective + positions * policy_loss
    count = max(positions, 1)
    return {
        "loss_sum": loss,
        "loss_mean": loss / count,
        "token_count": positions,
        "objective_mean": objective / count,
        "teacher_mass_mean": mass / count,
    }


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

    async def forward_backward_logits_async(
        self,
        data: list[Datum],
        teachers: list[list[tuple[Any, float]]],
        objective: ObjectiveSpec,
        coef: float = 1.0,
        loss_fn: str = "importance_sampling",
        loss_fn_config: dict[str, float] | None = None,
    ) -> Awaitable[ForwardBackwardOutput]:
        """forward_kl over the teacher's top k, read from each datum (the teachers are not
        asked again): one cross_entropy with the teacher's k tokens as targets, weighted
        coef * p / n (n the completion positions of the batch; Tinker sums where the local
        backend averages), then, where an advantage is non-zero (the reward), one
        `loss_fn` pass of the advantages / n, both before the next optim_step. The result
        has the local backend's metrics and the student's logprobs of the teacher's k
        tokens ([length, k]) per datum."""
        if refusal := topk_refusal(objective, loss_fn):
            raise BackendRejected(f"the backend rejected forward_backward_logits: {refusal}")
        masks = [completion_mask(datum, index) for index, datum in enumerate(data)]
        positions = max(int(sum(mask.sum() for mask in masks)), 1)
        distill = [tinker_datum(distilled(datum, coef / positions)) for datum in data]
        policy = []
        if any(np.any(datum.loss_fn_inputs["advantages"].to_numpy()) for datum in data):
            policy = [tinker_datum(advantaged(datum, 1 / positions)) for datum in data]
        future = self.client.forward_backward(distill, "cross_entropy")
        second = self.client.forward_backward(policy, loss_fn, loss_fn_config) if policy else None
        self.trained = True

        async def result() -> ForwardBackwardOutput:
            output = await result_of(future, self.timeout, trio_output)
            policy_loss = 0.0
            if second is not None:
                policy_loss = (await result_of(second, self.timeout, trio_output)).metrics[
                    "loss_sum"
                ]
            student = [record["logprobs"].to_numpy() for record in output.loss_fn_outputs]
            metrics = topk_metrics(data, masks, student, coef, policy_loss)
            return ForwardBackwardOutput(loss_fn_outputs=output.loss_fn_outputs, metrics=metrics)

        return result()

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
