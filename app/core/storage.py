"""The installation's object store (OPD_STORAGE_URL), as the API and the workers open it."""

from __future__ import annotations

from app.core.config import Settings
from kernel.storage.blobs import Storage, open_storage
from kernel.storage.cache import BlobCache


def storage_of(settings: Settings) -> Storage:
    return open_storage(settings.storage_url, settings.storage_retry_seconds)


def file_cache(settings: Settings) -> BlobCache:
    """A worker's copies of uploaded files, under <home>/cache/files."""
    return BlobCache(
        storage_of(settings), settings.home / "cache" / "files", settings.file_cache_bytes
    )
