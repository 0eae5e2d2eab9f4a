"""Checkpoints (training states, sampler and final weights) in a bucket, so that no worker
and no API needs another's disk.

With OPD_STORAGE_URL a folder, checkpoints stay where the backend wrote them (under
OPD_ARTIFACT_ROOT) and are recorded by that absolute path, as they always were. With a
bucket, a worker writes a checkpoint to its local folder as before, then uploads each of
its files as a content-addressed object and, last, a manifest object that lists every
file's relative path, sha256 and size. Only then is the checkpoint named, and so recorded:

    opd-store://<sha256 of the manifest>/<kind>/<name>

A worker killed mid-upload leaves objects no manifest lists and no record, so a resumed
job takes the checkpoint recorded before. Any process reads a recorded checkpoint back
into its own bounded cache (`<home>/cache/checkpoints/<manifest sha256>/`), each object
checked against its hash, the folder renamed into place once whole.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from kernel.errors import OPDError
from kernel.storage.blobs import SHA256, Storage
from kernel.storage.cache import evict
from kernel.storage.hashing import file_sha256

SCHEME = "opd-store"
CHECKPOINTS_PREFIX = "checkpoints"
"""Where in the bucket checkpoints' objects live (`s3://bucket/prefix/checkpoints/blobs/...`),
apart from uploaded files' (`s3://bucket/prefix/blobs/...`)."""
MANIFEST_FORMAT = "opd-checkpoint/1"


class StoredCheckpointError(OPDError):
    """A recorded checkpoint's manifest is not one this service wrote."""

    code = "bad_checkpoint"


def is_stored(path: str) -> bool:
    """Whether a recorded checkpoint path names objects in the store (else a local path)."""
    return path.startswith(f"{SCHEME}://")


def manifest_sha256(path: str) -> str:
    """The manifest object a stored checkpoint's name points to."""
    sha256 = urlsplit(path).netloc
    if not is_stored(path) or not SHA256.match(sha256):
        raise StoredCheckpointError(f"{path!r} does not name a checkpoint in the store")
    return sha256


def stored_name(sha256: str, kind: str, name: str) -> str:
    return f"{SCHEME}://{sha256}/{kind}/{name}"


def listing(folder: Path) -> list[dict[str, Any]]:
    """Every file under `folder` (links and other things are not checkpoint files)."""
    return [
        {
            "path": path.relative_to(folder).as_posix(),
            "sha256": file_sha256(path),
            "size": path.stat().st_size,
        }
        for path in sorted(folder.rglob("*"))
        if path.is_file() and not path.is_symlink()
    ]


def parsed_manifest(raw: bytes, sha256: str) -> list[dict[str, Any]]:
    """The files a manifest lists, each path relative and inside its folder."""
    try:
        manifest = json.loads(raw)
        files = manifest["files"] if manifest.get("format") == MANIFEST_FORMAT else None
        if not isinstance(files, list):
            raise ValueError("no file list")
        for entry in files:
            parts = Path(entry["path"]).parts
            if not parts or Path(entry["path"]).is_absolute() or ".." in parts:
                raise ValueError(f"path {entry['path']!r} leaves its folder")
            if not SHA256.match(entry["sha256"]):
                raise ValueError(f"{entry['sha256']!r} is not a sha256")
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise StoredCheckpointError(
            f"the manifest {sha256} is not a checkpoint manifest: {error}"
        ) from error
    return files


@dataclass(frozen=True)
class CheckpointStore:
    """A bucket's checkpoints, and this process's bounded cache of the ones it read."""

    storage: Storage
    cache: Path
    max_bytes: int

    async def upload(self, folder: Path, kind: str, name: str) -> str:
        """Put every file of `folder`, then its manifest; the checkpoint's name once all
        are in the store. Objects the store has already are not sent again."""
        files = await asyncio.to_thread(listing, folder)
        for entry in files:
            await self.storage.put_file(folder / entry["path"], entry["sha256"])
        body = json.dumps(
            {"format": MANIFEST_FORMAT, "kind": kind, "name": name, "files": files},
            sort_keys=True,
        ).encode()
        with tempfile.TemporaryDirectory(prefix="opd-manifest-") as scratch:
            manifest = Path(scratch) / "manifest"
            manifest.write_bytes(body)
            sha256 = file_sha256(manifest)
            await self.storage.put_file(manifest, sha256)
        return stored_name(sha256, kind, name)

    def files(self, path: str) -> list[dict[str, Any]]:
        """What a stored checkpoint holds, as its manifest lists it (blocking)."""
        sha256 = manifest_sha256(path)
        with tempfile.TemporaryDirectory(prefix="opd-manifest-") as scratch:
            target = Path(scratch) / "manifest"
            self.storage.fetch(sha256, target)
            return parsed_manifest(target.read_bytes(), sha256)

    def fetch_into(self, path: str, target: Path) -> None:
        """Every file of a stored checkpoint under `target` (a new folder; blocking)."""
        for entry in self.files(path):
            self.storage.fetch(entry["sha256"], target / entry["path"])

    def local(self, path: str) -> str:
        """A folder holding the checkpoint `path` names: a local path as it is; a stored
        one from this process's cache, fetched first if the cache lacks it (blocking)."""
        if not is_stored(path):
            return path
        folder = self.cache / manifest_sha256(path)
        if folder.is_dir():
            folder.touch()
        else:
            self.cache.mkdir(parents=True, exist_ok=True)
            staging = self.cache / f".{folder.name}.{uuid.uuid4().hex[:8]}.tmp"
            try:
                self.fetch_into(path, staging)
                staging.mkdir(exist_ok=True)  # a checkpoint of no files is still a folder
                staging.rename(folder)
            except OSError:
                if not folder.is_dir():
                    raise
            finally:
                shutil.rmtree(staging, ignore_errors=True)
        evict(self.cache, self.max_bytes, keep=folder)
        return str(folder)
