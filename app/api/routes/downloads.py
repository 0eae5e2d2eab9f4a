"""A checkpoint's weights as a .tar.gz: a local checkpoint's folder, archived by the API
(from the shared artifact folder, or with a bucket from the store), or a PyTRIO
checkpoint's archive, fetched once by a worker through PyTRIO's own REST client. The
SHA-256 of what is sent comes first, in the `X-Checkpoint-SHA256` header."""

from __future__ import annotations

import asyncio
import os
import tempfile
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter
from fastapi import Path as PathParam
from fastapi.responses import FileResponse
from starlette.background import BackgroundTask

from app.api.deps import (
    MAX_ID,
    JobDep,
    PrincipalDep,
    QueueDep,
    SessionDep,
    SettingsDep,
    WaitsDep,
)
from app.api.errors import ApiError, error_responses
from app.core.config import Settings
from app.core.queue import JobQueue, QueueUnavailable
from app.core.storage import checkpoint_store
from app.core.worker_calls import FETCH_ARCHIVE_TASK, TaskUnanswered, call_worker
from app.jobs.archives import SHA256_HEADER, fetched, fetched_path, write_archive
from app.jobs.checkpoints import CheckpointUnavailable, job_checkpoint
from app.jobs.tables import Checkpoint, Job
from kernel.playground import Archive, ArchiveTask, Outcome
from kernel.spec import stored_spec
from kernel.storage.blobs import BlobCorrupt, BlobMissing, StorageUnavailable
from kernel.storage.checkpoints import is_stored
from kernel.team_view import masked_text

router = APIRouter(prefix="/v1/jobs", tags=["checkpoints"])

CheckpointId = Annotated[int, PathParam(ge=1, le=MAX_ID, description="The checkpoint's id.")]
ARCHIVE_TYPE = "application/gzip"


async def stored_folder(checkpoint: Checkpoint, settings: Settings) -> Path:
    """A stored checkpoint's files, read into the API's cache (503 while the store is away)."""
    store = checkpoint_store(settings)
    if store is None:
        raise ApiError(
            409,
            "not_downloadable",
            f"checkpoint {checkpoint.id} is in a bucket, and this API's OPD_STORAGE_URL is a "
            "folder: give the API the workers' OPD_STORAGE_URL",
        )
    try:
        return Path(await asyncio.to_thread(store.local, checkpoint.path))
    except StorageUnavailable as error:
        raise ApiError(503, error.code, str(error)) from None
    except (BlobMissing, BlobCorrupt) as error:
        raise ApiError(
            404, "not_found", f"the files of checkpoint {checkpoint.id} are gone: {error}"
        ) from None


async def local_archive(checkpoint: Checkpoint, settings: Settings) -> Archive:
    """The checkpoint's folder (or its files in the bucket) archived into a temporary file
    (removed once sent)."""
    name = None
    if is_stored(checkpoint.path):
        folder = await stored_folder(checkpoint, settings)
        name = checkpoint.path.rstrip("/").rsplit("/", 1)[-1]
    else:
        folder = Path(checkpoint.path).resolve()
    if name is None and not folder.is_relative_to(settings.artifact_root.resolve()):
        raise ApiError(
            409,
            "not_downloadable",
            f"checkpoint {checkpoint.id} is not under this API's OPD_ARTIFACT_ROOT; the API "
            "serves the artifact folder the workers share",
        )
    if not folder.is_dir():
        raise ApiError(404, "not_found", f"the files of checkpoint {checkpoint.id} are gone")
    handle, out = tempfile.mkstemp(prefix="opd-checkpoint-", suffix=".tar.gz")
    os.close(handle)
    try:
        return await asyncio.to_thread(write_archive, folder, Path(out), name)
    except BaseException:
        os.unlink(out)
        raise


async def trio_archive(
    job: Job,
    checkpoint: Checkpoint,
    settings: Settings,
    queue: JobQueue,
    admin: bool,
) -> Archive:
    """The archive a worker fetched from PyTRIO, fetching it first if need be; a worker's
    failure is relayed whole to an admin key, with no worker folder to a team's."""

    def relayed(message: str) -> str:
        return message if admin else masked_text(message)

    destination = fetched_path(settings.artifact_root, job.id, checkpoint.id)
    if (kept := fetched(destination)) is not None:
        return kept
    task = ArchiveTask(
        spec=stored_spec(job.spec),
        path=checkpoint.path,
        destination=str(destination),
    )
    try:
        raw = await call_worker(
            queue,
            FETCH_ARCHIVE_TASK,
            task.model_dump_json(),
            settings.download_timeout,
            job.team_id,
            task_id=f"archive-{checkpoint.id}",
        )
    except QueueUnavailable as error:
        raise ApiError(503, "queue_unavailable", str(error)) from None
    except TaskUnanswered as error:
        raise ApiError(
            504,
            error.failure.code,
            f"{relayed(error.failure.message)}. A worker may still be fetching it: ask again later",
        ) from None
    outcome = Outcome[Archive].model_validate_json(raw)
    if outcome.value is not None:
        return outcome.value
    assert outcome.failure is not None
    status = 404 if outcome.failure.code == "checkpoint_not_found" else 502
    raise ApiError(status, outcome.failure.code, relayed(outcome.failure.message))


@router.get(
    "/{job_id}/checkpoints/{checkpoint_id}/download",
    response_class=FileResponse,
    responses={
        200: {
            "content": {ARCHIVE_TYPE: {}},
            "description": f"The .tar.gz; its SHA-256 (hex) in `{SHA256_HEADER}`.",
        },
        **error_responses(401, 403, 404, 409, 422, 429, 502, 503, 504),
    },
)
async def download_checkpoint(
    job: JobDep,
    checkpoint_id: CheckpointId,
    session: SessionDep,
    principal: PrincipalDep,
    settings: SettingsDep,
    queue: QueueDep,
    waits: WaitsDep,
) -> FileResponse:
    """Local checkpoints: the folder (LoRA adapter, tokenizer or optimizer state, manifest).
    PyTRIO checkpoints: PyTRIO's archive, fetched by a worker the first time (a 504 past
    OPD_DOWNLOAD_TIMEOUT means it is still coming: ask again). Tinker's stay on Tinker.
    Archiving and fetching hold no database connection, and one of the team's
    OPD_TEAM_MAX_WAITING places; past them, a 429 with Retry-After."""
    try:
        checkpoint = await job_checkpoint(session, job.id, checkpoint_id)
    except CheckpointUnavailable as error:
        raise ApiError(404, "not_found", str(error)) from None
    backend = job.spec.get("backend")
    if backend not in ("local", "trio"):
        raise ApiError(
            409,
            "not_downloadable",
            f"{backend} checkpoints stay on {backend}; fetch them with its own tools",
        )
    cleanup = None
    async with waits.released(session, principal.team_id):
        if backend == "local":
            archive = await local_archive(checkpoint, settings)
            cleanup = BackgroundTask(os.unlink, archive.path)
        else:
            archive = await trio_archive(job, checkpoint, settings, queue, principal.is_admin)
    return FileResponse(
        archive.path,
        media_type=ARCHIVE_TYPE,
        filename=f"job-{job.id}-{checkpoint.kind}-{checkpoint.step}.tar.gz",
        headers={SHA256_HEADER: archive.sha256},
        background=cleanup,
    )
