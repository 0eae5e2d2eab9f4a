"""The local backend's checkpoint folders: layout, atomic writes and manifests.

`<artifact_dir>/sampler/<name>/` holds a PEFT LoRA adapter (safetensors), the tokenizer
and `manifest.json`; `<artifact_dir>/state/<name>/` adds the optimizer state. A folder
is written under a temporary name and renamed into place, so a crash never leaves a
half-written checkpoint under a real name.
"""

from __future__ import annotations

import json
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pytrio.client.builders.training import CHECKPOINT_NAME_PATTERN

from kernel.errors import OPDError

MANIFEST = "manifest.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
OPTIMIZER_STATE = "optimizer.pt"
SAMPLER = "sampler"
STATE = "state"


class CheckpointError(OPDError):
    code = "bad_checkpoint"


def checkpoint_dir(artifact_dir: Path, kind: str, name: str) -> Path:
    """Where checkpoint `name` of `kind` lives; names follow PyTRIO's checkpoint-name rule."""
    if not isinstance(name, str) or not CHECKPOINT_NAME_PATTERN.fullmatch(name):
        raise CheckpointError(
            f"checkpoint name {name!r} is not valid: use letters, digits, '.', '_' and '-', "
            "starting with a letter or digit and not ending with '.'",
            code="invalid_checkpoint_name",
        )
    return (artifact_dir / kind / name).resolve()


@contextmanager
def atomic_dir(target: Path) -> Iterator[Path]:
    """Yield an empty temporary folder that replaces `target` once the block succeeds."""
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = target.parent / f".{target.name}.tmp-{uuid.uuid4().hex}"
    temporary.mkdir()
    try:
        yield temporary
        if target.exists():
            retired = target.parent / f".{target.name}.old-{uuid.uuid4().hex}"
            target.rename(retired)
            temporary.rename(target)
            shutil.rmtree(retired)
        else:
            temporary.rename(target)
    finally:
        shutil.rmtree(temporary, ignore_errors=True)


def write_manifest(folder: Path, **fields: Any) -> None:
    (folder / MANIFEST).write_text(json.dumps(fields, indent=2, sort_keys=True) + "\n")


def read_manifest(folder: Path, kind: str) -> dict[str, Any]:
    """The manifest of a `kind` checkpoint folder, or a CheckpointError saying what is wrong."""
    path = folder / MANIFEST
    if not folder.is_dir():
        raise CheckpointError(
            f"no {kind} checkpoint at {str(folder)!r}: pass a path returned by "
            f"save_{'state' if kind == STATE else 'weights_for_sampler'}"
        )
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise CheckpointError(
            f"{str(folder)!r} is not a readable {kind} checkpoint ({MANIFEST}: {error})"
        ) from error
    if not isinstance(manifest, dict) or manifest.get("kind") != kind:
        raise CheckpointError(
            f"{str(folder)!r} is not a {kind} checkpoint (its {MANIFEST} says "
            f"{manifest.get('kind') if isinstance(manifest, dict) else manifest!r})"
        )
    return manifest


def folder_size(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())
