"""PyTRIO's TrainingClient over a local LoRA model: losses, AdamW, saves and restores.

Requests are checked by PyTRIO's own planner, so a bad datum fails the same way on both
backends. The model stays in eval mode (no dropout), which keeps training a pure
function of the data: a run restored from a saved state continues exactly.
"""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from typing import Any

import torch
from peft import LoraConfig, PeftModel, get_peft_model, set_peft_model_state_dict
from pytrio.client.training_batch import (
    PolicyTrainingSample,
    normalize_loss_fn,
    plan_training_batch,
)
from pytrio.errors.base import ValidationError
from pytrio.model.limits import TrainingLimits
from pytrio.types import (
    AdamParams,
    Datum,
    ForwardBackwardOutput,
    OptimStepResponse,
    SaveWeightsForSamplerResponse,
    SaveWeightsResponse,
    TensorData,
)
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import Tensor

from kernel.spec import ObjectiveSpec
from kernel.spec.loop import LOSS_OPTIONS, SamplerCorrectionSpec
from worker.engine.backends.byte_level import TokenBytes
from worker.engine.backends.contract import TeacherShare
from worker.engine.backends.local.checkpoints import (
    ADAPTER_WEIGHTS,
    OPTIMIZER_STATE,
    SAMPLER,
    STATE,
    CheckpointError,
    atomic_dir,
    checkpoint_dir,
    folder_size,
    read_manifest,
    write_manifest,
)
from worker.engine.backends.local.decoding import row_chunks, target_logprobs
from worker.engine.backends.local.distillation import (
    Reading,
    Rows,
    Scorer,
    Totals,
    accumulate,
    check_completion_last,
)
from worker.engine.backends.local.losses import DENOMINATORS, LOSSES, sampler_gate
from worker.engine.backends.local.models import Placement
from worker.engine.backends.local.next_byte import ByteClasses
from worker.engine.backends.local.presets import drawing_alone
from worker.engine.backends.local.runner import SerialRunner
from worker.engine.backends.local.sampler import (
    AdapterOffSamplingClient,
    LocalSamplingClient,
    end_of_sequence_ids,
)

NO_LIMITS = TrainingLimits(max_batch_size=None, max_tokens_per_request=None, max_seq_len=None)
LORA_ALPHA = 32
IGNORE_TARGET = -100


def attach_lora(model: torch.nn.Module, rank: int, seed: int) -> PeftModel:
    """LoRA on every linear layer of attention and MLP, initialised from `seed`, in fp32."""
    config = LoraConfig(
        r=rank, lora_alpha=LORA_ALPHA, lora_dropout=0.0, target_modules="all-linear"
    )
    with drawing_alone():
        torch.manual_seed(seed)
        return get_peft_model(model, config, autocast_adapter_dtype=True)


class LocalTrainingClient:
    def __init__(
        self,
        runner: SerialRunner,
        model: PeftModel,
        tokenizer: Any,
        placement: Placement,
        base_model: str,
        rank: int,
        artifact_dir: Path,
    ) -> None:
        self.runner = runner
        self.model = model
        self.tokenizer = tokenizer
        self.placement = placement
        self.base_model = base_model
        self.rank = rank
        self.artifact_dir = artifact_dir
        self.trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
        self.optimizer = torch.optim.AdamW(self.trainable.values())
        self.steps = 0
        self.saved_states: set[str] = set()
        self.byte_tables: dict[int, ByteClasses] = {}
        # PyTRIO accepts load_state only before the first training operation; so do we.
        self.started = False

    def get_tokenizer(self) -> Any:
        return self.tokenizer

    async def forward_backward_async(
        self,
        data: list[Datum],
        loss_fn: str = "cross_entropy",
        loss_fn_config: dict[str, float] | None = None,
        correction: SamplerCorrectionSpec | None = None,
    ) -> asyncio.Future[ForwardBackwardOutput]:
        """Check the batch now; the returned future resolves once gradients are added.
        `correction` (`loop.sampler_correction`) weighs each token's loss by the bound on
        its trainer/sampler ratio, read from this same forward pass."""
        name, options, samples, plan = self.planned(data, loss_fn, loss_fn_config)
        denominator = getattr(plan.totals, DENOMINATORS.get(name, "total_active_tokens"))
        return self.runner.submit(
            self.accumulate_gradients,
            name,
            options,
            samples,
            plan.totals.total_active_tokens,
            max(denominator, 1),
            correction if correction is not None and correction.active else None,
        )

    async def forward_backward_logits_async(
        self,
        data: list[Datum],
        teachers: list[list[TeacherShare]],
        objective: ObjectiveSpec,
        coef: float = 1.0,
        loss_fn: str = "importance_sampling",
        loss_fn_config: dict[str, float] | None = None,
    ) -> asyncio.Future[ForwardBackwardOutput]:
        """Check the batch now; the future resolves once the gradient of the objective
        (times `coef`) plus the policy loss of the advantages, at each datum's completion
        positions (`weights` 1) and divided by their count, is added."""
        if not objective.logit_level:
            raise ValidationError(
                f"objective {objective.kind} trains through forward_backward",
                code="validation.invalid_objective",
            )
        name, options, samples, _ = self.planned(data, loss_fn, loss_fn_config)
        masks = [
            completion_mask(datum, sample.input_length)
            for datum, sample in zip(data, samples, strict=True)
        ]
        if len(teachers) != len(samples):
            raise ValidationError(
                f"{len(teachers)} teachers for {len(samples)} datums: give each datum its own",
                code="validation.invalid_teachers",
            )
        for mask, mixed in zip(masks, teachers, strict=True):
            if any(share.prompt is not None and share.view is None for share in mixed):
                check_completion_last(mask)
            for share in mixed:
                if share.view is not None and len(share.view.positions) != sum(mask):
                    raise ValidationError(
                        f"a teacher's view of a completion places {len(share.view.positions)} "
                        f"tokens, and the datum has {sum(mask)} completion positions",
                        code="validation.invalid_teachers",
                    )
        scorers = {
            id(share.client): self.teacher_scorer(share.client, share.view is not None)
            for mixed in teachers
            for share in mixed
        }
        rows = [
            [Reading(scorers[id(s.client)], s.weight, s.prompt, s.view) for s in mixed]
            for mixed in teachers
        ]
        positions = sum(sum(mask) for mask in masks)
        return self.runner.submit(
            self.accumulate_logit_gradients,
            objective,
            coef,
            name,
            options,
            samples,
            masks,
            rows,
            max(positions, 1),
        )

    def planned(
        self, data: list[Datum], loss_fn: str, loss_fn_config: dict[str, float] | None
    ) -> tuple[str, dict[str, float], list[PolicyTrainingSample], Any]:
        """The batch checked by PyTRIO's planner and this backend: the loss, its options,
        the samples and the plan."""
        plan = plan_training_batch(
            data,
            loss_fn=loss_fn,
            auto_shift=False,
            limits=NO_LIMITS,
            tokenizer_vocab_size=len(self.tokenizer),
        )
        name = normalize_loss_fn(loss_fn)
        if name not in LOSSES:
            raise ValidationError(
                f"the local backend implements the losses {', '.join(LOSSES)}, not {loss_fn!r}",
                code="validation.unsupported_loss_fn",
            )
        options = loss_options(name, loss_fn_config)
        samples = [sample for chunk in plan.chunks for sample in chunk.samples]
        if any(sample.model_input.has_images for sample in samples):
            raise ValidationError(
                "the local backend trains on text inputs only",
                code="validation.image_input_unsupported",
            )
        self.started = True
        return name, options, samples, plan

    def teacher_scorer(self, client: Any, across: bool = False) -> Scorer:
        """A teacher of this backend as the objective reads it: a frozen local model over
        the student's vocabulary (`across`: over its own, read by the next byte), or this
        client's own model (a self teacher) with its adapter off
        (`base_sampling_client_async`) or with the LoRA weights a sampler of it holds."""
        teacher = getattr(client, "inner", client)
        if isinstance(teacher, LocalSamplingClient) and teacher.model is self.model:
            base = self.model.get_base_model()
            if isinstance(teacher, AdapterOffSamplingClient):
                return Scorer(base, adapter_off=self.model.disable_adapter)
            return Scorer(base, weights=decoder_weights(self.model, teacher.weights))
        if not isinstance(teacher, LocalSamplingClient) or teacher.weights:
            raise ValidationError(
                "a logit-level objective needs teachers made by this backend's "
                "create_sampling_client (frozen local models) or by this training client",
                code="validation.invalid_teachers",
            )
        if across:
            return Scorer(teacher.model, classes=self.byte_classes(teacher))
        mine = self.model.get_output_embeddings().weight.shape[0]
        theirs = teacher.model.get_output_embeddings().weight.shape[0]
        if mine != theirs:
            raise ValidationError(
                f"the teacher's vocabulary has {theirs} tokens and the student's {mine}: "
                "a logit-level objective compares distributions over one vocabulary",
                code="validation.invalid_teachers",
            )
        return Scorer(teacher.model)

    def byte_classes(self, sampler: LocalSamplingClient | None = None) -> ByteClasses:
        """A model's tokens by the byte each begins with (`next_byte.py`): a teacher's
        (`sampler`'s) or, without one, the student's own; each made once."""
        model, tokenizer = (
            (self.model, self.tokenizer) if sampler is None else (sampler.model, sampler.tokenizer)
        )
        if id(tokenizer) not in self.byte_tables:
            size = model.get_output_embeddings().weight.shape[0]
            pieces = TokenBytes(tokenizer)
            self.byte_tables[id(tokenizer)] = ByteClasses(
                [pieces.piece(index) for index in range(size)],
                end_of_sequence_ids(model, tokenizer),
            )
        return self.byte_tables[id(tokenizer)]

    async def optim_step_async(self, adam_params: AdamParams) -> asyncio.Future[OptimStepResponse]:
        self.started = True
        return self.runner.submit(self.apply_optimizer, adam_params)

    async def base_sampling_client_async(self) -> LocalSamplingClient:
        """A sampler of this client's base model, its adapter off: a self teacher of `base`
        weights, with no second copy of them."""
        return AdapterOffSamplingClient(
            self.runner, self.model, self.tokenizer, self.placement, weights={}, version=0
        )

    async def save_weights_and_get_sampling_client_async(self) -> LocalSamplingClient:
        self.started = True
        weights, version = await self.runner.submit(self.snapshot)
        return LocalSamplingClient(
            self.runner, self.model, self.tokenizer, self.placement, weights, version
        )

    async def create_sampling_client_async(self, model_path: str) -> LocalSamplingClient:
        """A sampler over this model with LoRA weights `save_weights_for_sampler` saved: the
        same tensors and the same version (the steps they had taken) as the sampler made
        at that moment, so it draws exactly what that one would."""
        weights, version = await self.runner.submit(self.saved_sampler, Path(model_path))
        return LocalSamplingClient(
            self.runner, self.model, self.tokenizer, self.placement, weights, version
        )

    async def save_weights_for_sampler_async(
        self, name: str
    ) -> asyncio.Future[SaveWeightsForSamplerResponse]:
        self.started = True
        folder = checkpoint_dir(self.artifact_dir, SAMPLER, name)
        return self.runner.submit(self.save, folder, SAMPLER, SaveWeightsForSamplerResponse)

    async def save_state_async(self, name: str) -> asyncio.Future[SaveWeightsResponse]:
        """Refuses a name this run saved before, as PyTRIO's save_state(overwrite=False)
        does; a later run (a resumed job) may replace a folder an earlier one left."""
        if name in self.saved_states:
            raise ValidationError(
                f"a state named {name!r} was already saved in this run; save it under a new name",
                code="validation.checkpoint_exists",
            )
        self.started = True
        folder = checkpoint_dir(self.artifact_dir, STATE, name)
        self.saved_states.add(name)
        return self.runner.submit(self.save, folder, STATE, SaveWeightsResponse)

    async def load_state_with_optimizer_async(self, path: str) -> asyncio.Future[dict]:
        """Restore weights, optimizer and step count; only before the first training call."""
        return self.load(path, with_optimizer=True)

    async def load_state_async(self, path: str) -> asyncio.Future[dict]:
        """Restore a state's weights only: the optimizer and step count start fresh."""
        return self.load(path, with_optimizer=False)

    def load(self, path: str, *, with_optimizer: bool) -> asyncio.Future[dict]:
        if self.started:
            raise ValidationError(
                "load_state cannot be called after training has started. "
                "Call load_state before the first training operation.",
                code="validation.already_initialized",
            )
        self.started = True
        return self.runner.submit(self.restore, Path(path), with_optimizer)

    def accumulate_gradients(
        self,
        loss_fn: str,
        options: dict[str, float],
        samples: list[PolicyTrainingSample],
        token_count: int,
        denominator: int,
        correction: SamplerCorrectionSpec | None = None,
    ) -> ForwardBackwardOutput:
        """Add the gradient of the loss summed over every token of every datum and divided
        by `denominator`, as PyTRIO's trainer normalises a logical batch; each token's loss
        weighed by `correction`'s gate (`sampler_gate`)."""
        outputs: list[dict[str, TensorData]] = []
        loss_sum = 0.0
        vocab_size = self.model.get_output_embeddings().weight.shape[0]
        for chunk in row_chunks([s.input_length for s in samples], vocab_size):
            rows = samples[chunk]
            inputs = [s.model_input.to_ints() for s in rows]
            targets = [[max(t, 0) for t in s.target_tokens] for s in rows]
            logprobs = target_logprobs(
                self.model, inputs, targets, self.tokenizer.pad_token_id, self.placement.device
            )
            loss_inputs, mask = padded_loss_inputs(rows, logprobs.shape[1], logprobs.device)
            if correction is not None:
                mask = mask * sampler_gate(logprobs, loss_inputs, correction.kind, correction.c)
            loss = (LOSSES[loss_fn](logprobs, loss_inputs, options) * mask).sum()
            (loss / denominator).backward()
            loss_sum += loss.item()
            kept = (logprobs.detach() * mask).cpu()
            outputs.extend(
                {"logprobs": TensorData.from_torch(kept[i, : s.input_length])}
                for i, s in enumerate(rows)
            )
        return ForwardBackwardOutput(
            loss_fn_outputs=outputs,
            metrics={
                "loss_sum": loss_sum,
                "loss_mean": loss_sum / token_count if token_count else 0.0,
                "token_count": token_count,
            },
        )

    def accumulate_logit_gradients(
        self,
        objective: ObjectiveSpec,
        coef: float,
        loss_fn: str,
        options: dict[str, float],
        samples: list[PolicyTrainingSample],
        masks: list[list[bool]],
        teachers: list[list[Reading]],
        denominator: int,
    ) -> ForwardBackwardOutput:
        """`accumulate` over chunks of rows (`row_chunks`, as the policy losses)."""
        student = Scorer(self.model.get_base_model())
        totals = Totals()
        outputs: list[dict[str, TensorData]] = []
        vocab_size = self.model.get_output_embeddings().weight.shape[0]
        for chunk in row_chunks([s.input_length for s in samples], vocab_size):
            rows = Rows(samples[chunk], masks[chunk], teachers[chunk])
            picked, teacher_picked = accumulate(
                student,
                rows,
                objective,
                coef,
                (LOSSES[loss_fn], options),
                denominator,
                self.tokenizer.pad_token_id,
                self.placement.device,
                totals,
                self.byte_classes,
            )
            outputs.extend(
                {
                    "logprobs": TensorData.from_torch(row),
                    "teacher_logprobs": TensorData.from_torch(teacher_row),
                }
                for row, teacher_row in zip(picked, teacher_picked, strict=True)
            )
        positions = max(totals.positions, 1)
        metrics = {
            "loss_sum": totals.loss,
            "loss_mean": totals.loss / positions,
            "token_count": totals.positions,
            "objective_mean": totals.objective / positions,
        }
        if objective.top_k:
            metrics["teacher_mass_mean"] = totals.mass / positions
        return ForwardBackwardOutput(loss_fn_outputs=outputs, metrics=metrics)

    def apply_optimizer(self, adam: AdamParams) -> OptimStepResponse:
        """One AdamW step with this call's parameters, then clear the gradients."""
        for group in self.optimizer.param_groups:
            group.update(
                lr=adam.learning_rate,
                betas=(adam.beta1, adam.beta2),
                eps=adam.eps,
                weight_decay=adam.weight_decay,
            )
        max_norm = adam.grad_clip_norm if adam.grad_clip_norm > 0 else math.inf
        grad_norm = torch.nn.utils.clip_grad_norm_(list(self.trainable.values()), max_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.steps += 1
        return OptimStepResponse(
            metrics={"grad_norm": float(grad_norm), "learning_rate": adam.learning_rate}
        )

    def snapshot(self) -> tuple[dict[str, Tensor], int]:
        weights = {name: p.detach().clone() for name, p in self.trainable.items()}
        return weights, self.steps

    def saved_sampler(self, folder: Path) -> tuple[dict[str, Tensor], int]:
        """Sampler weights saved by a run of this model, keyed as its trainable parameters."""
        manifest = read_manifest(folder, SAMPLER)
        self.check_saved_by_this_model(f"sampler weights {str(folder)!r}", manifest)
        try:
            adapter = load_file(folder / ADAPTER_WEIGHTS)
            # peft saves each LoRA tensor without the adapter's name in its key.
            infix = f".{self.model.active_adapter}."
            weights = {
                name: adapter[name.replace(infix, ".")].to(param.device, param.dtype)
                for name, param in self.trainable.items()
            }
            if len(adapter) != len(weights):
                raise ValueError("its adapter does not match this model's LoRA layers")
        except (OSError, ValueError, KeyError, SafetensorError) as error:
            message = f"cannot load sampler weights {str(folder)!r}: {error}"
            raise CheckpointError(message) from error
        return weights, int(manifest["step"])

    def check_saved_by_this_model(self, what: str, manifest: dict) -> None:
        saved = (manifest.get("base_model"), manifest.get("lora_rank"))
        if saved != (self.base_model, self.rank):
            raise CheckpointError(
                f"{what} was saved by base model {saved[0]!r} with LoRA rank "
                f"{saved[1]}; this run uses {self.base_model!r} with rank {self.rank}",
                code="checkpoint_config_mismatch",
            )

    def save(self, folder: Path, kind: str, response: type[Any]) -> Any:
        with atomic_dir(folder) as temporary:
            # Embeddings are never trained; False also skips peft's Hugging Face Hub lookup.
            self.model.save_pretrained(temporary, save_embedding_layers=False)
            if kind == STATE:
                torch.save(self.optimizer.state_dict(), temporary / OPTIMIZER_STATE)
            else:
                self.tokenizer.save_pretrained(temporary)
            write_manifest(
                temporary,
                kind=kind,
                base_model=self.base_model,
                lora_rank=self.rank,
                step=self.steps,
            )
        return response(path=str(folder), model=self.base_model, size=folder_size(folder))

    def restore(self, folder: Path, with_optimizer: bool) -> dict:
        manifest = read_manifest(folder, STATE)
        self.check_saved_by_this_model(f"state {str(folder)!r}", manifest)
        try:
            adapter = load_file(folder / ADAPTER_WEIGHTS)
            result = set_peft_model_state_dict(self.model, adapter)
            if result.unexpected_keys or len(adapter) != len(self.trainable):
                raise ValueError("its adapter does not match this model's LoRA layers")
            if with_optimizer:
                optimizer_state = torch.load(folder / OPTIMIZER_STATE, weights_only=True)
                self.optimizer.load_state_dict(optimizer_state)
                self.steps = int(manifest["step"])
        except (OSError, ValueError, RuntimeError, KeyError, SafetensorError) as error:
            raise CheckpointError(f"cannot restore state {str(folder)!r}: {error}") from error
        return {}


def decoder_weights(model: PeftModel, weights: dict[str, Tensor]) -> dict[str, Tensor]:
    """A sampler's LoRA weights (named as the peft model's parameters) named as its
    decoder's, which holds every LoRA layer (`all-linear` leaves the output head out)."""
    decoder = model.get_base_model().get_decoder()
    prefix = next(name for name, module in model.named_modules() if module is decoder) + "."
    outside = [name for name in weights if not name.startswith(prefix)]
    if outside:
        raise ValidationError(
            f"the sampler's weight {outside[0]!r} lies outside the decoder",
            code="validation.invalid_teachers",
        )
    return {name.removeprefix(prefix): tensor for name, tensor in weights.items()}


def loss_options(loss_fn: str, given: dict[str, float] | None) -> dict[str, float]:
    """The loss's options: LOSS_OPTIONS' defaults, overridden by what the call gives; an
    option the loss does not take is refused, as the remote trainers refuse it."""
    defaults = LOSS_OPTIONS[loss_fn]
    unknown = sorted(set(given or {}) - defaults.keys())
    if unknown:
        raise ValidationError(
            f"loss_fn_config option(s) {', '.join(unknown)} do not apply to {loss_fn}; "
            f"it takes {', '.join(defaults) or 'none'}",
            code="validation.invalid_loss_fn_config",
        )
    return defaults | (given or {})


def completion_mask(datum: Datum, length: int) -> list[bool]:
    """The positions a logit-level objective compares: where the datum's `weights` is 1."""
    weights = datum.loss_fn_inputs.get("weights")
    if weights is None or weights.shape != [length]:
        raise ValidationError(
            f"a logit-level objective needs each datum's weights: 1 at the completion "
            f"positions, 0 on the prompt, shape [{length}]",
            code="validation.invalid_loss_fn_inputs",
        )
    return [bool(value) for value in weights.data]


def padded_loss_inputs(
    rows: list[PolicyTrainingSample], width: int, device: torch.device
) -> tuple[dict[str, Tensor], Tensor]:
    """The loss inputs of each row padded to `width`, and the mask of positions that count."""

    def padded(values: list[tuple[float, ...] | list[float]]) -> Tensor:
        out = torch.zeros((len(values), width), dtype=torch.float32)
        for i, row in enumerate(values):
            out[i, : len(row)] = torch.tensor(row, dtype=torch.float32)
        return out.to(device)

    mask = padded([[float(t != IGNORE_TARGET) for t in s.target_tokens] for s in rows])
    return {
        "logprobs": padded([s.logprobs for s in rows]),
        "advantages": padded([s.advantages for s in rows]),
    }, mask
