"""The installation's object store (OPD_STORAGE_URL), as the API and the workers open it.

Each team's uploaded files are objects of their own, under `files/team-<id>/` in the store:
the same bytes uploaded by two teams are two objects, so what one team uploads or deletes
never shows in, or touches, another's (docs/concepts/files.md says what a team can learn). Files
uploaded before that layout are objects of the shared `blobs/` at the store's root, still
read there (`reading_also`) and removed when no file of any team has their bytes.
"""

from __future__ import annotations

from app.core.config import Settings
from kernel.storage.blobs import Storage, open_storage
from kernel.storage.cache import BlobCache
from kernel.storage.checkpoints import CHECKPOINTS_PREFIX, CheckpointStore
from kernel.tables.bounds import TableLimits

FILES_PREFIX = "files"


def storage_of(settings: Settings) -> Storage:
    return open_storage(settings.storage_url, settings.storage_retry_seconds)


def team_files(storage: Storage, team_id: int) -> Storage:
    """Where the team's uploaded files live (`storage` is the installation's store)."""
    return storage.under(f"{FILES_PREFIX}/team-{team_id}").reading_also(storage)


def file_cache(settings: Settings, team_id: int) -> BlobCache:
    """A worker's copies of the team's uploaded files, under <home>/cache/files (one copy of
    the same bytes whichever team's they are: each is checked against its hash)."""
    return BlobCache(
        team_files(storage_of(settings), team_id),
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
