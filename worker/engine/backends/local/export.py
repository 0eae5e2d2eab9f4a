"""A saved LoRA as a plain Hugging Face model: the adapter merged into its base model's
weights (peft's `merge_and_unload`), saved as safetensors with the tokenizer, so that
`transformers` loads it without peft, its chat template rendering as the job's training did.
Before the folder takes its name, the merged model
is loaded back from disk and its logprobs on a probe prompt must match the adapter
model's, judged on the whole tensor (`||merged - adapter|| <= rtol * ||adapter||`).
"""

from __future__ import annotations

import json
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer

from kernel.errors import OPDError
from worker.engine.backends.local.checkpoints import MANIFEST
from worker.engine.backends.local.models import ModelCache, load_model, load_tokenizer
from worker.engine.backends.local.presets import drawing_alone

ADAPTER_CONFIG = "adapter_config.json"
PROBE = "Merging check: what is 12 + 30? Think step by step, then answer."
RTOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2}
"""How far the merged model's logprobs may be from the adapter's: float rounding only."""


class ExportError(OPDError):
    code = "export_failed"


@dataclass(frozen=True)
class Merged:
    folder: Path
    base_model: str
    relative_error: float
    rtol: float


def adapter_base_model(adapter: Path) -> str:
    """The base model a saved adapter belongs to: its manifest's (local checkpoints), else
    the one peft wrote in its adapter config."""
    if not (adapter / ADAPTER_CONFIG).is_file():
        raise ExportError(f"{adapter} holds no LoRA adapter ({ADAPTER_CONFIG} is missing)")
    for name, key in ((MANIFEST, "base_model"), (ADAPTER_CONFIG, "base_model_name_or_path")):
        path = adapter / name
        if path.is_file() and (base := json.loads(path.read_text()).get(key)):
            return str(base)
    raise ExportError(f"{adapter} does not say which base model it adapts: pass the base model")


def probe_logprobs(model: Any, ids: torch.Tensor) -> torch.Tensor:
    """Every position's log-probabilities over the vocabulary, in float64."""
    with torch.inference_mode():
        return model(input_ids=ids).logits.double().log_softmax(-1)


def tokenizer_of(adapter: Path, base_model: str, cache: ModelCache | None = None) -> Any:
    """The tokenizer saved beside the adapter (sampler weights keep one), else the base's."""
    if (adapter / "tokenizer_config.json").is_file():
        return AutoTokenizer.from_pretrained(adapter)
    return load_tokenizer(base_model, cache)


def same_mode_as(sibling: Path, folder: Path) -> None:
    """Give every file in `folder` the permissions of `sibling`: safetensors writes the
    weights through a private temporary file (0600) where the rest gets the umask's."""
    mode = sibling.stat().st_mode & 0o777
    for path in folder.iterdir():
        if path.is_file():
            path.chmod(mode)


def rendering_as_trained(chat_template: str | None, enable_thinking: bool) -> str | None:
    """The chat template with the job's `enable_thinking` as its default, so that a plain
    `apply_chat_template(messages)` renders prompts as training did (Qwen's templates think
    unless told not to; the job told them); a caller may still pass its own."""
    if not chat_template or "enable_thinking" not in chat_template:
        return chat_template
    default = "true" if enable_thinking else "false"
    return (
        f"{{%- if enable_thinking is not defined %}}{{%- set enable_thinking = {default} %}}"
        f"{{%- endif %}}{chat_template}"
    )


def merge_adapter(
    adapter: Path,
    out: Path,
    base_model: str | None = None,
    dtype: torch.dtype = torch.float32,
    enable_thinking: bool | None = None,
    cache: ModelCache | None = None,
) -> Merged:
    """Write the merged model of `adapter` to `out` (a new folder), once it checks out; with
    `enable_thinking` (the job's), its chat template renders as training rendered; a GGUF
    base model is read from its converted folder in `cache`."""
    base_model = base_model or adapter_base_model(adapter)
    tokenizer = tokenizer_of(adapter, base_model, cache)
    if enable_thinking is not None:
        tokenizer.chat_template = rendering_as_trained(tokenizer.chat_template, enable_thinking)
    base = load_model(base_model, dtype, cache)
    with drawing_alone():  # the adapter's layers are initialised, then read
        model = PeftModel.from_pretrained(base, adapter).eval()
    ids = torch.tensor([tokenizer.encode(PROBE, add_special_tokens=False)])
    expected = probe_logprobs(model, ids)
    merged = model.merge_and_unload()
    staging = out.parent / f".{out.name}.tmp-{uuid.uuid4().hex}"
    try:
        merged.save_pretrained(staging, safe_serialization=True)
        tokenizer.save_pretrained(staging)
        same_mode_as(staging / "config.json", staging)
        reloaded = AutoModelForCausalLM.from_pretrained(staging, dtype=dtype).eval()
        actual = probe_logprobs(reloaded, ids)
        error = float(torch.linalg.norm(actual - expected) / torch.linalg.norm(expected))
        if not error <= RTOL[dtype]:
            raise ExportError(
                f"the merged model's logprobs differ from the adapter model's by {error:.3g} "
                f"(relative), more than {RTOL[dtype]:g}: the merge is not faithful"
            )
        staging.rename(out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return Merged(out, base_model, error, RTOL[dtype])
