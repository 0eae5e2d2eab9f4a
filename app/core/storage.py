"""The installation's object store (OPD_STORAGE_URL), as the API and the workers open it."""

from __future__ import annotations

from app.core.config import Settings
from kernel.storage.blobs import Storage, open_storage
from kernel.storage.cache import BlobCache
from kernel.storage.checkpoints import CHECKPOINTS_PREFIX, CheckpointStore
from kernel.tables.bounds import TableLimits


def storage_of(settings: Settings) -> Storage:
    return open_storage(settings.storage_url, settings.storage_retry_seconds)


def file_cache(settings: Settings) -> BlobCache:
    """A worker's copies of uploaded files, under <home>/cache/files."""
    return BlobCache(
        storage_of(settings),
        settings.home / "cache" / "files",
        settings.file_cache_bytes,
        TableLimits.for_uploads(settings.max_upload_bytes),
    )


def checkpoint_store(settings: Settings) -> CheckpointStore | None:
    """Checkpoints in the bucket, read back into <home>/cache/checkpoints; None when
    OPD_STORAGE_URL is a folder (checkpoints stay under OPD_ARTIFACT_ROOT, as they were)."""
    if not storage_of(settings).remote:
        return None
    # Under a prefix of their own: deleting an uploaded file whose bytes a checkpoint's
    # object shares must never remove that object.
    url = f"{settings.storage_url.rstrip('/')}/{CHECKPOINTS_PREFIX}"
    return CheckpointStore(
        open_storage(url, settings.storage_retry_seconds),
        settings.home / "cache" / "checkpoints",
        settings.checkpoint_cache_bytes,
    )
