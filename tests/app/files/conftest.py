"""What the Files API tests share: the API's settings over each kind of store (a folder, a
bucket of moto's S3 server) with a small quota, and helpers to upload and to look at what
the store and the spool folder hold."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import obstore
import pytest

from app.core.config import Settings
from app.core.storage import storage_of
from tests.app.conftest import auth, serve
from tests.support import temporary_bucket

ROWS = [
    {"question": "What is 1 + 1?", "answer": "2", "level": 1},
    {"question": "What is 2 + 2?", "answer": "4", "level": 1},
    {"question": "What is 1 + 1?", "answer": "2", "level": 2},
    {"question": "  ", "answer": "none", "level": 3},
]
JSONL = "".join(json.dumps(row) + "\n" for row in ROWS).encode()
QUOTA = 4096


def unique_jsonl() -> bytes:
    """JSONL no other test uploads (the database is shared by the session's tests)."""
    return JSONL + json.dumps({"question": uuid.uuid4().hex, "answer": "x"}).encode() + b"\n"


def sized_jsonl(size: int) -> bytes:
    """One JSONL row of exactly `size` bytes, of bytes no other upload has."""
    head, tail = f'{{"question": "{uuid.uuid4().hex} ', '"}\n'
    return (head + "x" * (size - len(head) - len(tail)) + tail).encode()


@pytest.fixture(params=["folder", "s3"])
def settings(request, tmp_path, database_url, queue_name, redis) -> Iterator[Settings]:
    """The API's settings over each kind of store, with a small quota (4 KiB)."""
    fields: dict[str, Any] = {
        "home": tmp_path,
        "database_url": database_url,
        "redis_url": "redis://127.0.0.1:6379/15",
        "queue_name": queue_name,
        "migrate_on_start": False,
        "auth_cache_seconds": 0,
        "job_cache_seconds": 0,
        "team_max_file_bytes": QUOTA,
    }
    if request.param == "folder":
        yield Settings(**fields)
        return
    with temporary_bucket() as url:
        yield Settings(**fields, storage_url=url, storage_retry_seconds=2)


@pytest.fixture
async def client(settings):
    async with serve(settings) as http:
        yield http


def objects(settings: Settings) -> list[str]:
    """Every object of uploaded files in the store (checkpoints' are elsewhere)."""
    store = storage_of(settings).store
    paths = (item["path"] for batch in obstore.list(store) for item in batch)
    return sorted(p for p in paths if "blobs/sha256/" in p and not p.startswith("checkpoints/"))


def spooled(settings: Settings) -> list[str]:
    folder = settings.home / "uploads"
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


async def upload(client, key, data: Any, filename: str = "train.jsonl", headers=None, **params):
    query = {"filename": filename, **params}
    return await client.post(
        "/v1/files", params=query, content=data, headers=auth(key) | (headers or {})
    )
