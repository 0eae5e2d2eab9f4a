"""The files use cases behind both doors: upload (streamed to a spool file, checked, put
in the store, recorded and audited), read, stream the content, delete.

An upload holds no database connection while its body arrives or is checked. A refused
upload keeps nothing: its spool file is removed and nothing reaches the store or the
table; the refusal is audited. Deleting a file removes its bytes from the store once no
file of any team has them (whether an unfinished job reads it is app/jobs/uploads.py's to
decide, before it calls `delete_file`).
"""

from __future__ import annotations

import asyncio
import hashlib
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from app.audit.store import record_audit
from app.auth.keys import Principal
from app.core.config import Settings
from app.files.errors import FileRefused
from app.files.inspection import inspect_upload
from app.files.schemas import FileDetail, FileFormat, FilePublic, FileReport, public_id
from app.files.store import content_used, same_upload, team_bytes
from app.files.tables import UploadedFile
from kernel.storage.blobs import Storage
from kernel.tables.bounds import TableLimits

STALE_SPOOL_SECONDS = 24 * 3600
SUFFIXES = {".jsonl": FileFormat.jsonl, ".parquet": FileFormat.parquet, ".csv": FileFormat.csv}
MEDIA_TYPES = {
    FileFormat.jsonl: "application/jsonl",
    FileFormat.parquet: "application/vnd.apache.parquet",
    FileFormat.csv: "text/csv",
}


@dataclass(frozen=True)
class Upload:
    """What the request says of the file it sends."""

    filename: str
    format: FileFormat | None = None
    """None: the one the file name's extension says."""
    field: str | None = None
    answer_field: str | None = None
    declared_bytes: int | None = None


@dataclass(frozen=True)
class Spooled:
    path: Path
    bytes: int
    sha256: str


def format_of(filename: str, given: FileFormat | None) -> FileFormat:
    """The format given, else the one the file name's extension says."""
    if given is not None:
        return given
    suffix = Path(filename).suffix.lower()
    if suffix not in SUFFIXES:
        raise FileRefused(
            422,
            "unsupported_format",
            f"cannot tell the format of {filename!r}: name a .jsonl, .parquet or .csv file, "
            "or give format=jsonl|parquet|csv",
            "format",
        )
    return SUFFIXES[suffix]


def too_large(limit: int) -> FileRefused:
    return FileRefused(
        413, "file_too_large", f"the file is larger than this service's limit of {limit} bytes"
    )


def over_quota(used: int, quota: int) -> FileRefused:
    return FileRefused(
        413,
        "file_quota_exceeded",
        f"the team's files would hold more than its quota of {quota} bytes ({used} used); "
        "delete files it no longer needs (DELETE /v1/files/{id})",
    )


def spool_folder(settings: Settings) -> Path:
    return settings.home / "uploads"


def remove_stale_spools(folder: Path, older_than: float = STALE_SPOOL_SECONDS) -> int:
    """Remove spool files a killed API process left (older than `older_than` seconds: a
    younger one may be an upload another API process on this home is receiving)."""
    if not folder.is_dir():
        return 0
    cutoff, removed = time.time() - older_than, 0
    for part in folder.glob("*.part"):
        with suppress(FileNotFoundError):
            if part.stat().st_mtime < cutoff:
                part.unlink()
                removed += 1
    return removed


async def spool(
    chunks: AsyncIterator[bytes], folder: Path, limits: list[tuple[int, FileRefused]]
) -> Spooled:
    """The body in a private file under `folder`, hashed as it arrives; a body past one of
    `limits` (bytes, and the refusal) is refused as soon as it gets there (the file
    removed)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{uuid.uuid4().hex}.part"
    digest, size = hashlib.sha256(), 0
    try:
        with path.open("wb") as out:
            async for chunk in chunks:
                size += len(chunk)
                for most, refusal in limits:
                    if size > most:
                        raise refusal
                digest.update(chunk)
                out.write(chunk)
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return Spooled(path, size, digest.hexdigest())


async def upload_file(
    session: AsyncSession,
    principal: Principal,
    storage: Storage,
    settings: Settings,
    upload: Upload,
    chunks: AsyncIterator[bytes],
) -> tuple[UploadedFile, bool]:
    """Store the upload as a file of the caller's team; (the file, whether it is new: the
    team's same bytes with the same fields answer with the file they made). FileRefused,
    audited, when it cannot serve as a dataset or goes past a limit."""
    try:
        kind = format_of(upload.filename, upload.format)
        used = await team_bytes(session, principal.team_id)
        await session.commit()  # no connection held while the body arrives
        spooled = await spool(chunks, spool_folder(settings), limits(upload, used, settings))
    except FileRefused as refused:
        await audit_refusal(session, principal, upload, refused)
        raise
    try:
        existing = await same_upload(
            session, principal.team_id, spooled.sha256, upload.field, upload.answer_field
        )
        if existing is not None:
            return existing, False
        await session.commit()
        try:
            report = await asyncio.to_thread(
                inspect_upload,
                spooled.path,
                kind,
                upload.field,
                upload.answer_field,
                TableLimits.for_uploads(settings.max_upload_bytes),
            )
        except FileRefused as refused:
            await audit_refusal(session, principal, upload, refused)
            raise
        await storage.put_file(spooled.path, spooled.sha256)
    finally:
        spooled.path.unlink(missing_ok=True)
    row = UploadedFile(
        team_id=principal.team_id,
        filename=upload.filename,
        format=kind.value,
        bytes=spooled.bytes,
        sha256=spooled.sha256,
        rows=report.rows,
        question_field=report.question_field,
        answer_field=report.answer_field,
        report=report.model_dump(mode="json"),
    )
    session.add(row)
    await session.flush()
    detail = {"bytes": spooled.bytes, "sha256": spooled.sha256, "filename": upload.filename}
    await record_audit(session, principal, "file.upload", public_id(row.id or 0), 201, detail)
    return row, True


async def audit_refusal(
    session: AsyncSession, principal: Principal, upload: Upload, refused: FileRefused
) -> None:
    detail = {"error": refused.code, "filename": upload.filename}
    await record_audit(session, principal, "file.upload", None, refused.status, detail)


def limits(upload: Upload, used: int, settings: Settings) -> list[tuple[int, FileRefused]]:
    """The bytes an upload may reach, each with its refusal: the service's largest file and
    what is left of the team's quota; a declared size past one is refused at once."""
    limit, quota = settings.max_upload_bytes, settings.team_max_file_bytes
    bounds = [(limit, too_large(limit)), (quota - used, over_quota(used, quota))]
    for most, refusal in bounds:
        if upload.declared_bytes is not None and upload.declared_bytes > most:
            raise refusal
    return bounds


async def delete_file(
    session: AsyncSession, principal: Principal, storage: Storage, row: UploadedFile
) -> None:
    """Remove the file (audited); its bytes leave the store when no file has them."""
    await session.delete(await session.merge(row))
    await session.flush()
    await record_audit(session, principal, "file.delete", public_id(row.id or 0), 204)
    if not await content_used(session, row.sha256):
        with suppress(Exception):  # an object left behind costs bytes, never correctness
            await storage.delete(row.sha256)


def public(row: UploadedFile) -> FilePublic:
    return FilePublic(**public_fields(row))


def detail(row: UploadedFile) -> FileDetail:
    return FileDetail(**public_fields(row), report=FileReport.model_validate(row.report))


def public_fields(row: UploadedFile) -> dict[str, Any]:
    return {
        "id": public_id(row.id or 0),
        "filename": row.filename,
        "format": FileFormat(row.format),
        "bytes": row.bytes,
        "sha256": row.sha256,
        "rows": row.rows,
        "question_field": row.question_field,
        "answer_field": row.answer_field,
        "created_at": row.created_at,
    }
