"""The files use cases behind both doors: upload (streamed to a spool file, checked, put
in the team's part of the store, recorded and audited), read, stream the content, delete.

An upload holds no database connection while its body arrives or is checked. It reserves
its bytes of the team's quota as it starts (app/files/claims.py), and the spool disk it
fills in this process counts against the team's and the process's bounds. A refused
upload keeps nothing: its spool file is removed and nothing reaches the store or the
table; the refusal is audited. With an Idempotency-Key, the same request again answers
with the file it made, and another request with that key is refused. Deleting a file
removes its object once no file of the team has its bytes (whether an unfinished job
reads it is app/jobs/uploads.py's to decide, between `unlist_file` and `delete_file`).
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

from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from app.audit.store import record_audit
from app.auth.keys import Principal
from app.core.config import Settings
from app.core.db import detach
from app.core.idempotency import Idempotency
from app.core.storage import team_files
from app.core.waits import RETRY_AFTER_SECONDS, Limit, Places, TooManyWaiting
from app.files import claims
from app.files.errors import FileRefused, too_large
from app.files.inspection import inspect_upload
from app.files.names import control_character
from app.files.schemas import FileDetail, FileFormat, FilePublic, FileReport, public_id
from app.files.store import content_used, keyed_file, same_upload
from app.files.tables import UploadedFile
from kernel.storage.blobs import Storage
from kernel.tables.bounds import TableLimits

STALE_SPOOL_SECONDS = 24 * 3600
DELETE_LEASE_SECONDS = 60
"""How long a delete's claim on an object outlasts twice OPD_STORAGE_RETRY_SECONDS (the
store call it covers, retries included), should its process die meanwhile."""
ROUTE = "POST /v1/files"
"""What an upload's Idempotency-Key is bound to, with its parameters and bytes."""
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
    idempotency_key: str | None = None
    model: str | None = None
    """A file of conversations: the model its report counts the longest one's tokens in."""

    def idempotency(self, sha256: str) -> Idempotency | None:
        """The request, its bytes included, that a retry with the same key must repeat."""
        if self.idempotency_key is None:
            return None
        asked = {"filename": self.filename, "format": self.format, "field": self.field}
        body = asked | {"answer_field": self.answer_field, "sha256": sha256}
        if self.model is not None:  # absent otherwise: a key stored before it keeps matching
            body["model"] = self.model
        return Idempotency(self.idempotency_key, ROUTE, body)


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


def check_filename(filename: str) -> None:
    """Refuse a name with a control character: no header could carry it to a download."""
    if (found := control_character(filename)) is not None:
        raise FileRefused(
            422,
            "invalid_filename",
            f"the file name holds a control character ({found}); give a name without one",
            "filename",
        )


def reused_key(earlier: UploadedFile) -> FileRefused:
    return FileRefused(
        422,
        "idempotency_key_reused",
        f"Idempotency-Key {earlier.idempotency_key!r} was already used for "
        f"{public_id(earlier.id or 0)} with another file or other parameters; use a new key "
        "for a new upload",
        "Idempotency-Key",
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


def spool_places(settings: Settings) -> Places:
    """The spool disk that uploads in flight may fill in one API process, in bytes."""
    return Places(
        "bytes of uploads arriving",
        Limit(settings.team_max_spool_bytes, "OPD_TEAM_MAX_SPOOL_BYTES"),
        Limit(settings.max_spool_bytes, "OPD_MAX_SPOOL_BYTES"),
    )


@dataclass
class Allowance:
    """How far an upload's body may go: under fixed `limits` (bytes, and the refusal), in
    this process's spool `places` (taken as it grows, given back at the end), and within
    its `reservation` of the team's quota (grown as it arrives; none for the retry of a
    file made already)."""

    team_id: int
    limits: list[tuple[int, FileRefused]]
    places: Places
    reservation: claims.Reservation | None = None
    held: int = 0

    async def grow(self, size: int) -> None:
        """Let the body reach `size` bytes, else FileRefused."""
        for most, refusal in self.limits:
            if size > most:
                raise refusal
        if size > self.held:
            try:
                self.places.take(self.team_id, size - self.held)
            except TooManyWaiting as busy:
                raise FileRefused(
                    429, "too_many_requests", str(busy), retry_after=RETRY_AFTER_SECONDS
                ) from None
            self.held = size
        if self.reservation is not None:
            await self.reservation.cover(size)

    def give_back(self) -> None:
        self.places.give_back(self.team_id, self.held)
        self.held = 0


async def spool(chunks: AsyncIterator[bytes], folder: Path, allowance: Allowance) -> Spooled:
    """The body in a private file under `folder`, hashed as it arrives; a body past what
    `allowance` lets it reach is refused as soon as it gets there (the file removed)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{uuid.uuid4().hex}.part"
    digest, size = hashlib.sha256(), 0
    try:
        with path.open("wb") as out:
            async for chunk in chunks:
                size += len(chunk)
                await allowance.grow(size)
                digest.update(chunk)
                out.write(chunk)
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return Spooled(path, size, digest.hexdigest())


@dataclass(frozen=True)
class Receiving:
    """One upload under way: who sends it, where it goes, what it may reach."""

    session: AsyncSession
    principal: Principal
    storage: Storage
    settings: Settings
    upload: Upload
    allowance: Allowance

    async def spooled(self, chunks: AsyncIterator[bytes]) -> Spooled:
        await self.session.commit()  # no connection held while the body arrives
        return await spool(chunks, spool_folder(self.settings), self.allowance)


async def upload_file(
    session: AsyncSession,
    principal: Principal,
    storage: Storage,
    settings: Settings,
    upload: Upload,
    chunks: AsyncIterator[bytes],
    places: Places,
) -> tuple[UploadedFile, bool]:
    """Store the upload as a file of the caller's team; (the file, whether it is new: the
    team's same bytes with the same fields answer with the file they made, as does the
    same request again with its Idempotency-Key). FileRefused, audited, when it cannot serve
    as a dataset or goes past a limit; `places` are this process's spool bytes."""
    limit = settings.max_upload_bytes
    allowance = Allowance(principal.team_id, [(limit, too_large(limit))], places)
    receiving = Receiving(session, principal, storage, settings, upload, allowance)
    try:
        return await receive(receiving, chunks)
    except FileRefused as refused:
        await audit_refusal(session, principal, upload, refused)
        raise
    finally:
        allowance.give_back()


async def receive(receiving: Receiving, chunks: AsyncIterator[bytes]) -> tuple[UploadedFile, bool]:
    session, upload, allowance = receiving.session, receiving.upload, receiving.allowance
    team_id, quota = receiving.principal.team_id, receiving.settings.team_max_file_bytes
    check_filename(upload.filename)
    kind = format_of(upload.filename, upload.format)
    earlier = await keyed_file(session, team_id, upload.idempotency_key)
    if earlier is not None:  # a retry: it must send what made the file, and reserves nothing
        allowance.limits.append((earlier.bytes, reused_key(earlier)))
    if upload.declared_bytes is not None:
        await allowance.grow(upload.declared_bytes)
    if earlier is not None:
        spooled = await receiving.spooled(chunks)
        spooled.path.unlink(missing_ok=True)
        return repeated(earlier, upload.idempotency(spooled.sha256)), False
    allowance.reservation = await claims.reserve(session, team_id, allowance.held, quota)
    try:
        async with claims.renewed(session, allowance.reservation.id):
            return await store(receiving, kind, chunks)
    finally:
        await claims.release(session, allowance.reservation.id)  # one settled is gone already


async def store(
    receiving: Receiving, kind: FileFormat, chunks: AsyncIterator[bytes]
) -> tuple[UploadedFile, bool]:
    """Spool, check and put the upload in the store, then record it."""
    session, upload, claim = receiving.session, receiving.upload, receiving.allowance.reservation
    assert claim is not None
    team_id = claim.team_id
    spooled = await receiving.spooled(chunks)
    try:
        # The same bytes' file, under the lock a delete holds (a write first: SQLite's one
        # writer), kept until the answer is committed: a delete either ran first (this
        # upload makes a new file) or waits (the file answered exists until then).
        await claims.lock_team_files(session, team_id)
        await claims.renew(session, claim.id)
        existing = await same_upload(
            session, team_id, spooled.sha256, upload.field, upload.answer_field
        )
        if existing is not None:
            return existing, False
        await session.commit()
        report = await asyncio.to_thread(
            inspect_upload,
            spooled.path,
            kind,
            upload.field,
            upload.answer_field,
            TableLimits.for_uploads(receiving.settings.max_upload_bytes),
            upload.model,
        )
        await claims.claim_object(session, claim.id, team_id, spooled.sha256)
        await team_files(receiving.storage, team_id).put_file(spooled.path, spooled.sha256)
    finally:
        spooled.path.unlink(missing_ok=True)
        receiving.allowance.give_back()
    row = UploadedFile(
        team_id=team_id,
        filename=upload.filename,
        format=kind.value,
        bytes=spooled.bytes,
        sha256=spooled.sha256,
        rows=report.rows,
        question_field=report.question_field,
        answer_field=report.answer_field,
        report=report.model_dump(mode="json"),
    )
    return await record(receiving, row, claim, upload.idempotency(spooled.sha256))


async def record(
    receiving: Receiving, row: UploadedFile, claim: claims.Reservation, key: Idempotency | None
) -> tuple[UploadedFile, bool]:
    """Insert the file's row against the team's quota, its claim ending with it; a file
    that a request with the same Idempotency-Key made meanwhile is the answer instead."""
    session = receiving.session
    if key is not None:
        row.idempotency_key, row.request_hash = key.key, key.fingerprint
    await claims.lock_team_files(session, row.team_id)
    session.add(row)
    try:
        await session.flush()
    except IntegrityError:
        await session.rollback()
        earlier = await keyed_file(session, row.team_id, key.key if key else None)
        if earlier is None:
            raise
        return repeated(earlier, key), False
    await claims.settle(session, claim.id, row.team_id, row.bytes, claim.quota)
    detail = {"bytes": row.bytes, "sha256": row.sha256, "filename": row.filename}
    await record_audit(
        session, receiving.principal, "file.upload", public_id(row.id or 0), 201, detail
    )
    return detach(session, row), True


def repeated(earlier: UploadedFile, key: Idempotency | None) -> UploadedFile:
    """The file a request with this Idempotency-Key made, if this one is the same."""
    assert key is not None
    if earlier.request_hash != key.fingerprint:
        raise reused_key(earlier)
    return earlier


async def audit_refusal(
    session: AsyncSession, principal: Principal, upload: Upload, refused: FileRefused
) -> None:
    await session.rollback()
    detail = {"error": refused.code, "filename": upload.filename}
    await record_audit(session, principal, "file.upload", None, refused.status, detail)


async def unlist_file(session: AsyncSession, row: UploadedFile) -> None:
    """Delete the file's row (flushed, not committed) under the team's files lock, so what
    the caller checks next (the jobs that read it) is what the delete commits against: an
    upload of the same bytes or a job's admission waits for it (on SQLite the write comes
    first, taking the one writer's place)."""
    await claims.lock_team_files(session, row.team_id)
    await session.delete(await session.merge(row))
    await session.flush()


async def delete_file(
    session: AsyncSession, principal: Principal, storage: Storage, row: UploadedFile
) -> None:
    """Remove the file `unlist_file` unlisted (audited); its object leaves the team's part of
    the store once the delete is committed and no file of the team has its bytes (nor an
    upload under way counts on them), and the shared layout's object once no file of any
    team has them."""
    lease = DELETE_LEASE_SECONDS + 2 * storage.retry_seconds
    deleting = await claims.claim_deletion(session, row.team_id, row.sha256, lease)
    unshared = deleting is not None and not await content_used(session, row.sha256)
    await record_audit(session, principal, "file.delete", public_id(row.id or 0), 204)
    if deleting is None:
        return
    try:
        with suppress(Exception):  # an object left behind costs bytes, never correctness
            await team_files(storage, row.team_id).delete(row.sha256)
            if unshared:
                await storage.delete(row.sha256)
    finally:
        await claims.release(session, deleting)


async def content(storage: Storage, row: UploadedFile) -> AsyncIterator[bytes]:
    """The file's bytes, once the store has said it has them (BlobMissing otherwise)."""
    return await team_files(storage, row.team_id).open(row.sha256)


async def download_url(storage: Storage, row: UploadedFile, seconds: int) -> str | None:
    """A presigned URL of the file's object (None: a folder has none; BlobMissing)."""
    return await team_files(storage, row.team_id).presigned_url(row.sha256, seconds)


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
        "purpose": row.purpose,
        "created_at": row.created_at,
    }
