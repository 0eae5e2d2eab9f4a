"""A worker's local copies of objects it reads from the store (uploaded datasets), kept in
one folder under a byte budget: the least recently used copies are removed first, never
the one just asked for. A copy is whole or absent (Storage.fetch renames it into place
after its hash is checked), so two jobs of one worker may ask for the same object at
once."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from kernel.storage.blobs import Storage, blob_key


@dataclass(frozen=True)
class BlobCache:
    storage: Storage
    folder: Path
    max_bytes: int

    def path(self, sha256: str, suffix: str = "") -> Path:
        """A local copy of the object, fetched when the cache lacks it (blocking)."""
        blob_key(sha256)  # refuses a name that is not a hash before it becomes a path
        target = self.folder / f"{sha256}{suffix}"
        if target.is_file():
            os.utime(target)
        else:
            self.storage.fetch(sha256, target)
        self.evict(keep=target)
        return target

    def evict(self, keep: Path) -> None:
        """Remove the least recently used copies until the rest fit the budget."""
        copies = []
        for entry in os.scandir(self.folder):
            if entry.is_file() and not entry.name.startswith("."):
                stat = entry.stat()
                copies.append((stat.st_mtime, stat.st_size, Path(entry.path)))
        total = sum(size for _, size, _ in copies)
        for _, size, copy in sorted(copies):
            if total <= self.max_bytes:
                break
            if copy != keep:
                copy.unlink(missing_ok=True)
                total -= size
