"""Content-addressed objects in a folder or an S3-compatible bucket, through obstore.

An object is named by the sha256 of its bytes (`blobs/sha256/ab/abcd...`), so the same
bytes are stored once whoever uploads them, and every read checks the bytes against their
name: a reader never takes a damaged or half-written object for the real one. Writes go
through obstore's multipart upload (a folder: a temporary file renamed into place), so an
object is either whole or absent.

`open_storage(url)` takes a folder path (or `file://`) or `s3://bucket/prefix`; an S3
store reads its endpoint, region and credentials from the usual AWS_* variables
(AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION, AWS_ALLOW_HTTP).
`Storage.under(prefix)` is the same store below a prefix (a store of its own for each
team's files), and a store's `fallback` is read where it lacks an object (objects written
before that prefix existed).
"""

from __future__ import annotations

import hashlib
import os
import re
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import obstore
from obstore.exceptions import BaseError, NotFoundError
from obstore.store import LocalStore, S3Store

from kernel.errors import OPDError

BLOBS = "blobs/sha256"
CHUNK = 1 << 20
PART_BYTES = 8 * CHUNK
DEFAULT_RETRY_SECONDS = 60.0
SHA256 = re.compile(r"^[0-9a-f]{64}$")


class StorageUnavailable(OPDError):
    """The store did not answer, or refused the service's credentials; retry later."""

    code = "storage_unavailable"


class BlobMissing(OPDError):
    """No object by this hash (deleted, or never completely written)."""

    code = "blob_missing"


class BlobCorrupt(OPDError):
    """An object whose bytes do not hash to its name: it is never used."""

    code = "blob_corrupt"


def blob_key(sha256: str) -> str:
    """Where the object of these bytes lives in the store."""
    if not SHA256.match(sha256):
        raise ValueError(f"not a sha256 hex digest: {sha256!r}")
    return f"{BLOBS}/{sha256[:2]}/{sha256}"


def unavailable(error: BaseError | OSError, what: str) -> StorageUnavailable:
    """The store's failure in one line (obstore appends a multi-line debug dump)."""
    reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return StorageUnavailable(f"the object store did not complete {what}: {reason}")


@dataclass(frozen=True)
class Storage:
    """One store and the URL it was opened from (shown to operators, never to teams)."""

    store: Any
    url: str
    retry_seconds: float = DEFAULT_RETRY_SECONDS
    fallback: Storage | None = None
    """Read where this store lacks an object; never written or deleted through this one."""
    below: dict[str, Storage] = field(default_factory=dict, compare=False, repr=False)
    """The stores under a prefix opened so far (one client each, not one per call)."""

    def under(self, prefix: str) -> Storage:
        """This store below `prefix` (`a/b`: objects at `<url>/a/b/blobs/...`)."""
        if prefix not in self.below:
            self.below[prefix] = open_storage(
                f"{self.url.rstrip('/')}/{prefix}", self.retry_seconds
            )
        return self.below[prefix]

    def reading_also(self, fallback: Storage) -> Storage:
        """This store, reading `fallback` where it lacks an object."""
        return replace(self, fallback=fallback, below={})

    @property
    def remote(self) -> bool:
        """Whether the store is a bucket (downloads may be redirected to presigned URLs)."""
        return isinstance(self.store, S3Store)

    async def put_file(self, path: Path, sha256: str) -> bool:
        """Upload the file whose bytes hash to `sha256`, streamed in parts, unless the store
        has it already; True when it was written."""
        key = blob_key(sha256)
        if await self.has(sha256):
            return False
        try:
            await obstore.put_async(self.store, key, path, chunk_size=PART_BYTES)
        except (BaseError, OSError) as error:
            raise unavailable(error, f"writing {key}") from error
        return True

    async def has(self, sha256: str) -> bool:
        try:
            await obstore.head_async(self.store, blob_key(sha256))
        except (FileNotFoundError, NotFoundError):
            return False
        except (BaseError, OSError) as error:
            raise unavailable(error, "a lookup") from error
        return True

    async def delete(self, sha256: str) -> None:
        """Remove the object (absent already is fine)."""
        try:
            await obstore.delete_async(self.store, blob_key(sha256))
        except (FileNotFoundError, NotFoundError):
            return
        except (BaseError, OSError) as error:
            raise unavailable(error, "a delete") from error

    async def open(self, sha256: str) -> AsyncIterator[bytes]:
        """The object's bytes in chunks, once the store has answered that it has them
        (BlobMissing, StorageUnavailable before any byte); BlobCorrupt after the last chunk
        if they do not hash to `sha256` (a reader that keeps them must discard what it read)."""
        key = blob_key(sha256)
        try:
            result = await obstore.get_async(self.store, key)
        except (FileNotFoundError, NotFoundError) as error:
            if self.fallback is not None:
                return await self.fallback.open(sha256)
            raise BlobMissing(f"object {sha256} is not in the store") from error
        except (BaseError, OSError) as error:
            raise unavailable(error, f"reading {key}") from error
        return checked_chunks(result, sha256, key)

    def fetch(self, sha256: str, target: Path) -> None:
        """Download the object to `target` (blocking; for a worker's thread): written to a
        private temporary file, checked against its hash, then renamed into place, so
        `target` is whole or absent."""
        key = blob_key(sha256)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
        digest = hashlib.sha256()
        try:
            result = obstore.get(self.store, key)
            with tmp.open("wb") as out:
                for chunk in result.stream(min_chunk_size=CHUNK):
                    digest.update(chunk)
                    out.write(chunk)
            if digest.hexdigest() != sha256:
                raise BlobCorrupt(f"object {sha256} in the store does not hash to its name")
            tmp.replace(target)
        except (FileNotFoundError, NotFoundError) as error:
            if self.fallback is not None:
                return self.fallback.fetch(sha256, target)
            raise BlobMissing(f"object {sha256} is not in the store") from error
        except BaseError as error:
            raise unavailable(error, f"reading {key}") from error
        finally:
            tmp.unlink(missing_ok=True)

    async def presigned_url(self, sha256: str, seconds: int) -> str | None:
        """A URL that reads the object without credentials for `seconds`, once the store has
        answered that it has it (BlobMissing otherwise); None for a folder."""
        if not self.remote:
            return None
        if not await self.has(sha256):
            if self.fallback is not None:
                return await self.fallback.presigned_url(sha256, seconds)
            raise BlobMissing(f"object {sha256} is not in the store")
        return obstore.sign(self.store, "GET", blob_key(sha256), timedelta(seconds=seconds))


async def checked_chunks(result: Any, sha256: str, key: str) -> AsyncIterator[bytes]:
    """A got object's bytes, hashed as they go: BlobCorrupt at the end when they are not
    the ones `sha256` names."""
    digest = hashlib.sha256()
    try:
        async for chunk in result.stream(min_chunk_size=CHUNK):
            digest.update(chunk)
            yield bytes(chunk)
    except (BaseError, OSError) as error:
        raise unavailable(error, f"reading {key}") from error
    if digest.hexdigest() != sha256:
        raise BlobCorrupt(f"object {sha256} in the store does not hash to its name")


def open_storage(url: str, retry_seconds: float = DEFAULT_RETRY_SECONDS) -> Storage:
    """The store `url` names: `s3://bucket/prefix` or a folder (made if missing). A bucket's
    requests are retried with exponential backoff for up to `retry_seconds` before a call
    fails with StorageUnavailable."""
    parts = urlsplit(url)
    if parts.scheme == "s3":
        if not parts.netloc:
            raise ValueError(f"{url!r} names no bucket: give s3://bucket/prefix")
        try:
            store = S3Store.from_url(
                url, client_options=client_options(), retry_config=retries(retry_seconds)
            )
        except BaseError as error:
            raise ValueError(f"cannot open {url}: {error}") from error
        return Storage(store, url, retry_seconds)
    if parts.scheme not in ("", "file"):
        raise ValueError(f"{url!r}: give a folder or s3://bucket/prefix")
    folder = Path(parts.path if parts.scheme == "file" else url).expanduser().resolve()
    folder.mkdir(parents=True, exist_ok=True)
    return Storage(LocalStore(folder, mkdir=True), str(folder), retry_seconds)


def retries(seconds: float) -> dict[str, Any]:
    """Retries for `seconds`, however many that takes: a refused connection fails in
    milliseconds, so a count of attempts (obstore's default, 10) is over in 2-3 s."""
    return {
        "max_retries": 1_000_000,
        "retry_timeout": timedelta(seconds=seconds),
        "backoff": {
            "init_backoff": timedelta(milliseconds=100),
            "max_backoff": timedelta(seconds=max(0.1, min(15.0, seconds / 4))),
            "base": 2,
        },
    }


def client_options() -> dict[str, Any]:
    """HTTP endpoints (a MinIO or a test server) need allow_http, which obstore reads from
    AWS_ALLOW_HTTP; an endpoint given as http:// turns it on by itself."""
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL", "")
    return {"allow_http": True} if endpoint.startswith("http://") else {}
