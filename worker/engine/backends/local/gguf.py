"""GGUF files as Hugging Face folders: converted once, kept in a cache keyed by the file's
sha256, then loaded like any local model.

transformers reads a GGUF (through the `gguf` package) and dequantises it to float weights,
which takes tens of seconds on a CPU; saved as a plain folder (safetensors, config,
tokenizer) it loads in seconds. A folder takes its name only when it is whole (written beside
it, synced, renamed), so a conversion cut short is never used; a lock file beside it keeps two
converters on one machine from doing the work twice (where the lock does not reach, the
rename still lets only one folder take the name). The file's digest is kept by path, size and
mtime, so loading the same file again does not read it whole again.
"""

from __future__ import annotations

import copy
import fcntl
import hashlib
import json
import logging
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

from kernel.errors import OPDError

log = logging.getLogger(__name__)

GGUF_SUFFIX = ".gguf"
CACHE_ENV = "OPD_MODEL_CACHE"
GGUF_EXTRA = "smollm2"
"""The extra that installs the `gguf` package transformers reads GGUF files with."""
CHUNK_BYTES = 8 * 1024 * 1024

Note = Callable[[str, dict[str, Any]], None]
"""Hears what a person waiting on a load may want to know: a conversion, and how long it took."""
Convert = Callable[[Path, Path], None]


class ExtraNotInstalled(OPDError):
    code = "extra_not_installed"


class GGUFUnreadable(OPDError):
    code = "model_not_found"


def quiet(message: str, data: dict[str, Any]) -> None:
    """A Note that tells no one."""


def is_gguf(name: str) -> bool:
    return name.lower().endswith(GGUF_SUFFIX)


def default_model_cache() -> Path:
    """Where converted models go outside the service: OPD_MODEL_CACHE, else the user's cache
    folder (`$XDG_CACHE_HOME/opd/models`, by default `~/.cache/opd/models`)."""
    if folder := os.environ.get(CACHE_ENV):
        return Path(folder).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "opd" / "models"


def require_gguf_reader(what: str) -> None:
    """transformers needs the `gguf` package to read `what`; say which extra installs it."""
    try:
        found = find_spec("gguf") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise ExtraNotInstalled(
            f"{what} is a GGUF file, which the local backend reads with the 'gguf' package, "
            f"which this worker lacks: install the {GGUF_EXTRA!r} extra with "
            f"pip install 'opd-service[{GGUF_EXTRA}]'"
        )


def converted(gguf: Path, cache: Path, note: Note = quiet, convert: Convert | None = None) -> Path:
    """The Hugging Face folder of `gguf` in `cache`, converting it (`convert`, by default
    `write_folder`) the first time; `note` hears of a conversion before and after."""
    digest = file_digest(gguf, cache)
    folder = cache / f"gguf-{digest}"
    if folder.is_dir():
        return folder
    with locked(cache / f".gguf-{digest}.lock"):
        if folder.is_dir():  # another converter finished while this one waited
            return folder
        for stale in cache.glob(f".gguf-{digest}.tmp-*"):  # a converter that died
            shutil.rmtree(stale, ignore_errors=True)
        size_mb = gguf.stat().st_size / 1e6
        # The team reads the note (a job's events): the file by its name, no folder of
        # the workers' (the cache's goes to the operator's log).
        data = {"file": gguf.name, "sha256": digest}
        log.info("converting %s into %s", gguf, folder)
        note(
            f"Converting {gguf.name} ({size_mb:.0f} MB) into a Hugging Face folder, once: "
            "later loads read it from the workers' model cache",
            data,
        )
        started = time.monotonic()
        staging = cache / f".gguf-{digest}.tmp-{uuid.uuid4().hex}"
        try:
            (convert or write_folder)(gguf, staging)
            sync_tree(staging)
            os.rename(staging, folder)
            sync_folder(cache)
        except OSError:
            if not folder.is_dir():  # else another machine's rename won: use its folder
                raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        seconds = time.monotonic() - started
        note(f"Converted {gguf.name} in {seconds:.0f} s", data | {"seconds": round(seconds, 1)})
    return folder


def write_folder(gguf: Path, folder: Path) -> None:
    """transformers' reading of `gguf`, dequantised to float32, as a plain model folder."""
    require_gguf_reader(str(gguf))
    where = {"pretrained_model_name_or_path": gguf.parent, "gguf_file": str(gguf)}
    try:
        tokenizer = AutoTokenizer.from_pretrained(**where, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(
            **where, local_files_only=True, dtype=torch.float32
        )
    except (OSError, ValueError, KeyError, NotImplementedError) as error:
        raise GGUFUnreadable(
            f"transformers cannot read {gguf.name} as a causal language model ({error}): "
            "give a GGUF of an architecture transformers reads, or a Hugging Face folder"
        ) from error
    dequantised(model).save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)


def dequantised(model: PreTrainedModel) -> PreTrainedModel:
    """The same weights in a model that says nothing of GGUF: transformers refuses to save
    one loaded from a GGUF, and a saved `quantization_config` would make it read the folder
    as a GGUF again. The tensors are shared, not copied."""
    config = copy.deepcopy(model.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    with torch.device("meta"):
        plain = type(model)(config)
    plain.load_state_dict(model.state_dict(), assign=True, strict=True)
    return plain


def file_digest(path: Path, cache: Path) -> str:
    """The sha256 of `path`, read once for each path, size and mtime (kept in `cache`)."""
    path = path.resolve()
    stat = path.stat()
    key = {"path": str(path), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    record = cache / "digests" / f"{hashlib.sha256(str(path).encode()).hexdigest()}.json"
    try:
        kept = json.loads(record.read_text())
        if {name: kept.get(name) for name in key} == key:
            return str(kept["sha256"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while chunk := file.read(CHUNK_BYTES):
            digest.update(chunk)
    record.parent.mkdir(parents=True, exist_ok=True)
    staging = record.with_name(f".{record.name}.tmp-{uuid.uuid4().hex}")
    staging.write_text(json.dumps(key | {"sha256": digest.hexdigest()}))
    staging.replace(record)
    return digest.hexdigest()


@contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive lock on `path` (made if absent) while the block runs."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def sync_tree(folder: Path) -> None:
    """Every file in `folder`, and the folder, on disk before it takes its name."""
    for path in folder.rglob("*"):
        if path.is_file():
            with path.open("rb") as file:
                os.fsync(file.fileno())
    sync_folder(folder)


def sync_folder(folder: Path) -> None:
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
