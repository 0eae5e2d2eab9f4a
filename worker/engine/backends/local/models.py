"""Where the local backend's models come from and where they run.

A base model is a built-in preset (tiny ones made in process, arithmetic ones trained
and shipped as weights), a Hugging Face model available offline (a folder by its absolute
path, or a hub id already in the hub cache, read from there only), or a GGUF file (a preset
another package ships, `packaged.py`, or a file by its absolute path) converted once into a
folder in the model cache (`gguf.py`); it runs on CUDA in bfloat16 when present, else on the
CPU in float32, unless the spec says otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from huggingface_hub import snapshot_download
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

from kernel.datapaths import is_model_path
from kernel.errors import OPDError
from kernel.model_names import (
    BUILT_IN_PRESETS,
    PACKAGED_PRESETS,
    PRESETS,
    TINY_PRESETS,
    TRAINED_PRESETS,
)
from kernel.spec import LocalBackendSpec
from worker.engine.backends.local.gguf import Note, converted, default_model_cache, is_gguf, quiet
from worker.engine.backends.local.packaged import packaged_file
from worker.engine.backends.local.presets import preset_tokenizer, tiny_model
from worker.engine.backends.local.trained import trained_model


class ModelNotFound(OPDError):
    code = "model_not_found"


class DeviceUnavailable(OPDError):
    code = "device_unavailable"


@dataclass(frozen=True)
class Placement:
    """The device the models run on and the dtype of their frozen weights."""

    device: torch.device
    dtype: torch.dtype


def resolve_placement(spec: LocalBackendSpec) -> Placement:
    """auto = CUDA with bfloat16 when a GPU is present, else the CPU with float32."""
    cuda = torch.cuda.is_available()
    if spec.device == "cuda" and not cuda:
        raise DeviceUnavailable(
            "local.device is 'cuda' but this machine has no usable CUDA GPU; "
            "set local.device to 'auto' or 'cpu'"
        )
    device = torch.device(
        "cuda" if spec.device == "cuda" or (spec.device == "auto" and cuda) else "cpu"
    )
    if spec.dtype == "auto":
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    else:
        dtype = getattr(torch, spec.dtype)
    return Placement(device, dtype)


@dataclass(frozen=True)
class ModelCache:
    """Where GGUF files are kept as converted folders, and who hears of a conversion."""

    folder: Path
    note: Note = quiet

    @classmethod
    def default(cls) -> ModelCache:
        return cls(default_model_cache())


def load_tokenizer(base_model: str, cache: ModelCache | None = None) -> Any:
    if base_model in BUILT_IN_PRESETS:
        return preset_tokenizer(base_model)
    folder = located(base_model, cache or ModelCache.default())
    try:
        return AutoTokenizer.from_pretrained(folder, local_files_only=True)
    except (OSError, ValueError) as error:
        raise not_found(base_model, error) from error


def load_model(
    base_model: str, dtype: torch.dtype, cache: ModelCache | None = None
) -> PreTrainedModel:
    """The base model on the CPU in `dtype`, in eval mode (no dropout: training is exact)."""
    if base_model in TINY_PRESETS:
        return tiny_model(base_model).to(dtype)
    if base_model in TRAINED_PRESETS:
        return trained_model(base_model).to(dtype)
    folder = located(base_model, cache or ModelCache.default())
    try:
        model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True, dtype=dtype)
    except (OSError, ValueError) as error:
        raise not_found(base_model, error) from error
    model.name_or_path = model.config.name_or_path = base_model  # what a saved adapter names
    return model.eval()


def located(base_model: str, cache: ModelCache) -> str:
    """The folder `base_model`'s files are in: a GGUF file's (a packaged preset's, or one
    given as a path) is its converted folder in `cache`; a folder is given as a path (by the
    service, an absolute one: the API and the worker's check refuse any other); a hub id is
    read from the hub cache only, never as a folder relative to the worker's directory,
    which would load what lies there and answer differently whether it exists."""
    if base_model in PACKAGED_PRESETS:
        return str(converted(packaged_file(base_model), cache.folder, cache.note))
    if is_model_path(base_model):
        if is_gguf(base_model) and Path(base_model).is_file():
            return str(converted(Path(base_model), cache.folder, cache.note))
        return base_model
    try:
        return snapshot_download(base_model, local_files_only=True)
    except (OSError, ValueError) as error:
        raise not_found(
            base_model, "not a built-in preset, nor in this worker's hub cache"
        ) from error


def not_found(base_model: str, reason: object) -> ModelNotFound:
    return ModelNotFound(
        f"the local backend cannot load {base_model!r}: pass a path to a Hugging Face model "
        f"folder (config, weights and tokenizer) or a GGUF file, a hub id already in the "
        f"workers' hub cache, or one of the presets {', '.join(PRESETS)} ({reason})"
    )
