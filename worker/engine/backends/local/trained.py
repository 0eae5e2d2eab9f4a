"""Built-in presets trained on the arithmetic task, shipped as safetensors beside this file.

`scripts/train_arith_presets.py` trains them (Qwen3 models over the tiny presets' byte-level
tokenizer and chat template, or a preset's own: `presets.preset_tokenizer`) and writes
`weights/manifest.json`: each file's sha256, the model's sizes, how it was trained and the
accuracies it measured. Loading checks the sha256, so a damaged or replaced file is
refused instead of quietly served.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_model, save_model
from transformers import Qwen3ForCausalLM

from kernel.errors import OPDError
from worker.engine.backends.local.presets import drawing_alone, preset_config, preset_tokenizer

WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"
MANIFEST = "manifest.json"
STORED_DTYPE = torch.float16
"""Half the bytes in the repository; the accuracies are measured on the stored weights."""


class PresetCorrupt(OPDError):
    code = "preset_corrupt"


def read_manifest(folder: Path = WEIGHTS_DIR) -> dict[str, Any]:
    path = folder / MANIFEST
    return json.loads(path.read_text()) if path.is_file() else {}


def measured_accuracy(name: str, folder: Path = WEIGHTS_DIR) -> float | None:
    """The held-out accuracy the manifest records for preset `name` on the arithmetic task
    (all its operations), or None for a model that is no trained preset."""
    measured = read_manifest(folder).get(name, {}).get("measured", {})
    return measured.get("accuracy")


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def trained_model(name: str, folder: Path = WEIGHTS_DIR) -> Qwen3ForCausalLM:
    """The preset `name`, after checking its file against the manifest's sha256."""
    entry = read_manifest(folder).get(name)
    if entry is None:
        raise PresetCorrupt(f"preset {name!r} is not in {folder / MANIFEST}")
    path = folder / entry["file"]
    if not path.is_file() or file_sha256(path) != entry["sha256"]:
        raise PresetCorrupt(
            f"{path} is missing or does not match the sha256 in {folder / MANIFEST}: "
            "restore it from the repository or rerun scripts/train_arith_presets.py"
        )
    with drawing_alone():
        model = Qwen3ForCausalLM(preset_config(preset_tokenizer(name), **entry["config"]))
    load_model(model, path)
    model.name_or_path = model.config.name_or_path = name
    return model.eval()


def save_trained(
    name: str, model: Qwen3ForCausalLM, record: dict[str, Any], folder: Path = WEIGHTS_DIR
) -> None:
    """Store `model` in half precision and its manifest entry: sizes, sha256 and `record`."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.safetensors"
    save_model(model.to(STORED_DTYPE), str(path))
    model.float()
    sizes = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
    sizes += ("num_key_value_heads", "head_dim")
    manifest = read_manifest(folder)
    manifest[name] = {
        "file": path.name,
        "sha256": file_sha256(path),
        "config": {key: getattr(model.config, key) for key in sizes},
    } | record
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
