"""The sha256 of a file, read in chunks: what names an object in the store, and what a
download is checked against."""

from __future__ import annotations

import hashlib
from pathlib import Path

CHUNK = 1 << 20


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as source:
        while chunk := source.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()
