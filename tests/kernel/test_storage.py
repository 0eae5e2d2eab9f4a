"""The object store, in a folder and in a bucket on moto's S3 server: objects named by
their sha256 are stored once, read back whole and checked, refused when damaged or
missing; a store that does not answer is StorageUnavailable after its retries; a worker's
cache keeps its copies under a byte budget."""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

import obstore
import pytest

from kernel.storage.blobs import (
    BlobCorrupt,
    BlobMissing,
    Storage,
    StorageUnavailable,
    blob_key,
    open_storage,
)
from kernel.storage.cache import BlobCache
from kernel.storage.hashing import file_sha256
from tests.e2e.servers import Relay
from tests.support import S3_ENDPOINT, temporary_bucket, temporary_storage


@pytest.fixture(params=["folder", "s3"])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Storage]:
    with temporary_storage(request.param, tmp_path) as storage:
        yield storage


def written(folder: Path, data: bytes, name: str = "data.bin") -> tuple[Path, str]:
    path = folder / name
    path.write_bytes(data)
    return path, hashlib.sha256(data).hexdigest()


async def read_all(storage: Storage, sha256: str) -> bytes:
    return b"".join([chunk async for chunk in await storage.open(sha256)])


async def test_an_object_is_stored_once_and_read_back_whole(storage, tmp_path):
    data = os.urandom(3 << 20) + b"tail"  # several chunks, an uneven end
    path, sha = written(tmp_path, data)
    assert file_sha256(path) == sha
    assert not await storage.has(sha)
    assert await storage.put_file(path, sha) is True
    assert await storage.put_file(path, sha) is False  # the same bytes: stored once
    assert await storage.has(sha)
    assert await read_all(storage, sha) == data
    target = tmp_path / "copy" / "data"
    await asyncio.to_thread(storage.fetch, sha, target)
    assert target.read_bytes() == data
    await storage.delete(sha)
    assert not await storage.has(sha)
    await storage.delete(sha)  # already gone is fine


async def test_a_damaged_object_is_refused_and_never_left_as_a_copy(storage, tmp_path):
    _, sha = written(tmp_path, b"the real bytes")
    await obstore.put_async(storage.store, blob_key(sha), b"other bytes")
    with pytest.raises(BlobCorrupt):
        await read_all(storage, sha)
    target = tmp_path / "copy"
    with pytest.raises(BlobCorrupt):
        await asyncio.to_thread(storage.fetch, sha, target)
    assert not target.exists() and not any(p.name.endswith(".tmp") for p in tmp_path.iterdir())


async def test_a_missing_object_is_blob_missing(storage, tmp_path):
    sha = "0" * 64
    with pytest.raises(BlobMissing):
        await read_all(storage, sha)
    with pytest.raises(BlobMissing):
        await asyncio.to_thread(storage.fetch, sha, tmp_path / "copy")
    assert not (tmp_path / "copy").exists()


def test_a_name_that_is_not_a_hash_never_becomes_a_key():
    with pytest.raises(ValueError, match="sha256"):
        blob_key("../../etc/passwd")


async def test_a_store_that_does_not_answer_is_unavailable_after_its_retries(tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    storage = open_storage("s3://absent/opd", retry_seconds=0.5)
    path, sha = written(tmp_path, b"bytes")
    with pytest.raises(StorageUnavailable, match="did not complete") as raised:
        await storage.put_file(path, sha)
    assert "\n" not in str(raised.value)
    with pytest.raises(StorageUnavailable):
        await asyncio.to_thread(storage.fetch, sha, tmp_path / "copy")


def test_open_storage_refuses_a_scheme_it_does_not_know():
    with pytest.raises(ValueError, match="s3://bucket/prefix"):
        open_storage("gs://bucket/x")
    with pytest.raises(ValueError, match="no bucket"):
        open_storage("s3:///x")


async def test_presigned_urls_are_for_buckets_only_and_objects_there(storage, tmp_path):
    path, sha = written(tmp_path, b"signed")
    if not storage.remote:
        assert await storage.presigned_url(sha, 60) is None
        return
    with pytest.raises(BlobMissing):
        await storage.presigned_url(sha, 60)
    await storage.put_file(path, sha)
    url = await storage.presigned_url(sha, 60)
    assert url is not None and "X-Amz-Signature" in url and blob_key(sha) in url


async def test_a_store_under_a_prefix_writes_its_own_and_reads_its_fallback_too(storage, tmp_path):
    """A team's part of the store: what it writes and deletes is its own; what it lacks is
    read from the store it falls back on (objects written before the prefix existed)."""
    own = storage.under("files/team-1").reading_also(storage)
    assert storage.under("files/team-1").store is own.store  # one client per prefix
    old_path, old = written(tmp_path, b"written before", "old")
    new_path, new = written(tmp_path, b"written under the prefix", "new")
    await storage.put_file(old_path, old)
    assert await own.put_file(new_path, new) is True
    assert not await storage.has(new) and not await own.has(old)  # each holds its own
    assert await read_all(own, old) == b"written before"
    await asyncio.to_thread(own.fetch, old, tmp_path / "copy")
    assert (tmp_path / "copy").read_bytes() == b"written before"
    if storage.remote:
        assert blob_key(old) in (await own.presigned_url(old, 60) or "")
    await own.delete(old)  # its own only: the fallback's object stays
    assert await storage.has(old)
    await own.delete(new)
    with pytest.raises(BlobMissing):
        await own.open(new)


async def test_the_cache_keeps_its_copies_under_its_budget(storage, tmp_path):
    shas = []
    for index in range(3):
        path, sha = written(tmp_path, bytes([index]) * 1000, f"d{index}")
        await storage.put_file(path, sha)
        shas.append(sha)
    cache = BlobCache(storage, tmp_path / "cache", max_bytes=2500)
    first = await asyncio.to_thread(cache.path, shas[0], ".jsonl")
    assert first.read_bytes() == b"\x00" * 1000 and first.suffix == ".jsonl"
    await asyncio.to_thread(cache.path, shas[1], ".jsonl")
    os.utime(first, (1, 1))  # the least recently used
    await asyncio.to_thread(cache.path, shas[2], ".jsonl")
    kept = sorted(p.name for p in (tmp_path / "cache").iterdir())
    assert kept == sorted(f"{sha}.jsonl" for sha in shas[1:])
    await storage.delete(shas[2])
    again = await asyncio.to_thread(cache.path, shas[2], ".jsonl")  # a hit: no store read
    assert again.read_bytes() == b"\x02" * 1000


async def test_a_store_away_for_seconds_is_waited_for_within_its_retry_time(tmp_path, monkeypatch):
    """Connections refused fail fast: the retries must span `retry_seconds`, not a count
    of quick attempts (ten of them took 3 s, so a 5-15 s outage failed a job's save)."""
    with temporary_bucket() as url:
        relay = Relay(int(S3_ENDPOINT.rsplit(":", 1)[1]))
        monkeypatch.setenv("AWS_ENDPOINT_URL", relay.url)
        storage = open_storage(url, retry_seconds=60)
        path, sha = written(tmp_path, b"saved while the store was away")
        loop = asyncio.get_running_loop()
        loop.call_later(8.0, relay.start)
        try:
            assert await storage.put_file(path, sha) is True
        finally:
            relay.cut()
    assert relay.answers, "the write went through the relay once it was up"
