"""A worker's local copies of objects it reads from the store (uploaded datasets; and, in
their own folder, checkpoints: kernel/storage/checkpoints.py), kept in one folder under a
byte budget: the least recently used copies are removed first, never the one just asked
for. A copy is whole or absent (Storage.fetch renames it into place
after its hash is checked), so two jobs of one worker may ask for the same object at
once."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from kernel.storage.blobs import Storage, blob_key
from kernel.tables.bounds import TableLimits


@dataclass(frozen=True)
class BlobCache:
    storage: Storage
    folder: Path
    max_bytes: int
    table_limits: TableLimits = field(default_factory=TableLimits)
    """What a copied upload, a table, must keep before a job reads it (kernel/tables)."""

    def path(self, sha256: str, suffix: str = "") -> Path:
        """A local copy of the object, fetched when the cache lacks it (blocking)."""
        blob_key(sha256)  # refuses a name that is not a hash before it becomes a path
        target = self.folder / f"{sha256}{suffix}"
        if target.is_file():
            os.utime(target)
        else:
            self.storage.fetch(sha256, target)
        evict(self.folder, self.max_bytes, keep=target)
        return target


def size_of(entry: os.DirEntry[str]) -> int:
    if entry.is_dir(follow_symlinks=False):
        return sum(p.stat().st_size for p in Path(entry.path).rglob("*") if p.is_file())
    return entry.stat().st_size


def evict(folder: Path, max_bytes: int, keep: Path) -> None:
    """Remove the least recently used copies (files, or folders of files) in `folder`
    until the rest fit `max_bytes`; never `keep`, nor what is still being written (a
    name starting with a dot)."""
    copies = []
    for entry in os.scandir(folder):
        if not entry.name.startswith(".") and not entry.is_symlink():
            copies.append((entry.stat().st_mtime, size_of(entry), Path(entry.path)))
    total = sum(size for _, size, _ in copies)
    for _, size, copy in sorted(copies):
        if total <= max_bytes:
            break
        if copy != keep:
            if copy.is_dir():
                shutil.rmtree(copy, ignore_errors=True)
            else:
                copy.unlink(missing_ok=True)
            total -= size
