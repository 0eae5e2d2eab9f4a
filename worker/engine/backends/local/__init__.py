"""The `local` backend: PyTRIO's client API over PyTorch, transformers and peft in process.

A LoRA student trains against a frozen teacher on one device; every model call runs on
one worker thread (see `runner.py`) so the event loop stays free for heartbeats.
"""

from __future__ import annotations

import asyncio
import secrets
from pathlib import Path
from typing import Any

import torch
from peft import PeftModel
from pytrio.errors.base import ValidationError
from safetensors import SafetensorError

from kernel.spec import LocalBackendSpec
from worker.engine.backends.local.checkpoints import SAMPLER, CheckpointError, read_manifest
from worker.engine.backends.local.gguf import Note, default_model_cache, quiet
from worker.engine.backends.local.models import (
    ModelCache,
    load_model,
    load_tokenizer,
    resolve_placement,
)
from worker.engine.backends.local.presets import drawing_alone
from worker.engine.backends.local.runner import SerialRunner
from worker.engine.backends.local.sampler import LocalSamplingClient
from worker.engine.backends.local.trainer import LocalTrainingClient, attach_lora

__all__ = ["LocalSamplingClient", "LocalServiceClient", "LocalTrainingClient"]

MIN_RANK, MAX_RANK = 4, 64


class LocalServiceClient:
    """PyTRIO's ServiceClient for the local backend; checkpoints go under `artifact_dir`,
    GGUF files converted to folders under `model_cache` (`note` hears of a conversion)."""

    def __init__(
        self,
        spec: LocalBackendSpec,
        artifact_dir: Path,
        model_cache: Path | None = None,
        note: Note = quiet,
    ) -> None:
        self.placement = resolve_placement(spec)
        self.artifact_dir = Path(artifact_dir).resolve()
        self.model_cache = model_cache or default_model_cache()
        self.note = note
        self.cpu_threads = spec.cpu_threads
        self.runner = SerialRunner(self.pin_threads)

    def models(self) -> ModelCache:
        """The model cache for a load on the runner's thread: its notes reach `note` on the
        calling event loop (sinks are not thread-safe)."""
        loop, note = asyncio.get_running_loop(), self.note

        def on_loop(message: str, data: dict[str, Any]) -> None:
            loop.call_soon_threadsafe(note, message, data)

        return ModelCache(self.model_cache, on_loop)

    def pin_threads(self) -> None:
        """On the CPU, torch's thread count decides how sums are split, so it is fixed."""
        if self.placement.device.type == "cpu":
            torch.set_num_threads(self.cpu_threads)

    async def create_lora_training_client_async(
        self, base_model: str, rank: int = 32, seed: int | None = None
    ) -> LocalTrainingClient:
        if not MIN_RANK <= rank <= MAX_RANK:
            raise ValidationError(
                f"rank must be in [{MIN_RANK}, {MAX_RANK}]. Got {rank}",
                code="validation.invalid_lora_rank",
            )
        lora_seed = secrets.randbits(31) if seed is None else seed
        return await self.runner.submit(
            self.training_client, base_model, rank, lora_seed, self.models()
        )

    async def create_sampling_client_async(
        self, base_model: str, model_path: str | None = None
    ) -> LocalSamplingClient:
        """A frozen model: the base, plus a LoRA saved by save_weights_for_sampler if given."""
        return await self.runner.submit(self.sampling_client, base_model, model_path, self.models())

    def training_client(
        self, base_model: str, rank: int, seed: int, models: ModelCache
    ) -> LocalTrainingClient:
        tokenizer = load_tokenizer(base_model, models)
        model = attach_lora(load_model(base_model, self.placement.dtype, models), rank, seed)
        return LocalTrainingClient(
            self.runner,
            model.to(self.placement.device),
            tokenizer,
            self.placement,
            base_model,
            rank,
            self.artifact_dir,
        )

    def sampling_client(
        self, base_model: str, model_path: str | None, models: ModelCache
    ) -> LocalSamplingClient:
        tokenizer = load_tokenizer(base_model, models)
        model = load_model(base_model, self.placement.dtype, models)
        if model_path is not None:
            folder = Path(model_path)
            saved_base = read_manifest(folder, SAMPLER).get("base_model")
            if saved_base != base_model:
                raise CheckpointError(
                    f"{model_path!r} holds LoRA weights for {saved_base!r}, not {base_model!r}: "
                    "set the teacher's base_model to the model those weights were trained on",
                    code="checkpoint_config_mismatch",
                )
            try:
                with drawing_alone():  # the adapter's layers are initialised, then read
                    adapted = PeftModel.from_pretrained(model, folder)
                model = adapted.merge_and_unload()
            except (OSError, ValueError, RuntimeError, KeyError, SafetensorError) as error:
                raise CheckpointError(
                    f"cannot load LoRA weights {model_path!r}: {error}"
                ) from error
        model.requires_grad_(False)
        return LocalSamplingClient(
            self.runner,
            model.to(self.placement.device),
            tokenizer,
            self.placement,
            weights={},
            version=0,
        )
