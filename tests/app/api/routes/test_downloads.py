"""Downloading a local checkpoint: its folder as a .tar.gz, the SHA-256 of what is sent in
a header first, the same bytes each time; only the caller's team's jobs, only folders
under the artifact folder, or read from the bucket. (PyTRIO's archives:
tests/worker/service/test_quick.py.)"""

from __future__ import annotations

import hashlib
import io
import shutil
import tarfile
from contextlib import asynccontextmanager
from pathlib import Path

import obstore
import pytest

from app.core.storage import checkpoint_store, storage_of
from app.jobs.store import claim_job
from app.records.store import record_checkpoint
from tests.app.conftest import auth, serve, small_spec
from tests.support import temporary_bucket

FILES = {
    "adapter_model.safetensors": b"\x00weights\x01" * 100,
    "manifest.json": b'{"kind": "sampler"}\n',
    "tokenizer/tokenizer.json": b"{}",
}


@pytest.fixture
def saved(session, submit, settings):
    """A job of the caller's team with one checkpoint folder at `where`."""

    async def make(where: Path | None = None, **spec: object) -> dict:
        folder = where or settings.artifact_root / "job-x" / "sampler" / "run"
        for name, data in FILES.items():
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            (folder / name).write_bytes(data)
        job = await submit(**spec)
        await claim_job(session, job["id"], "w", heartbeat_timeout=60)
        await record_checkpoint(session, job["id"], "w", 2, "sampler", str(folder))
        return job

    return make


async def download_url(client, key, job_id: int) -> str:
    listed = await client.get(f"/v1/jobs/{job_id}/checkpoints", headers=auth(key))
    return f"/v1/jobs/{job_id}/checkpoints/{listed.json()['data'][0]['id']}/download"


async def test_a_local_checkpoint_comes_as_a_tar_gz_with_its_sha256(client, key, saved):
    job = await saved()
    url = await download_url(client, key, job["id"])

    first = await client.get(url, headers=auth(key))
    second = await client.get(url, headers=auth(key))

    assert first.status_code == 200, first.text
    assert first.headers["content-type"] == "application/gzip"
    assert "attachment" in first.headers["content-disposition"]
    assert first.headers["x-checkpoint-sha256"] == hashlib.sha256(first.content).hexdigest()
    assert second.content == first.content  # the same files, the same archive
    with tarfile.open(fileobj=io.BytesIO(first.content)) as tar:
        unpacked = {
            member.name: tar.extractfile(member).read() for member in tar if member.isfile()
        }
    assert unpacked == {f"run/{name}": data for name, data in FILES.items()}


async def test_only_the_callers_teams_checkpoints_are_served(client, key, make_key, saved):
    job = await saved()
    url = await download_url(client, key, job["id"])
    assert (await client.get(url, headers=auth(await make_key()))).status_code == 404
    other = await saved()
    wrong_job = url.replace(f"/jobs/{job['id']}/", f"/jobs/{other['id']}/")
    assert (await client.get(wrong_job, headers=auth(key))).status_code == 404
    missing = f"/v1/jobs/{job['id']}/checkpoints/999999/download"
    assert (await client.get(missing, headers=auth(key))).status_code == 404


async def test_a_folder_outside_the_artifact_root_or_gone_is_not_sent(
    client, key, saved, tmp_path, settings
):
    outside = await saved(tmp_path / "elsewhere" / "run")
    url = await download_url(client, key, outside["id"])
    refused = await client.get(url, headers=auth(key))
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "not_downloadable"

    gone_folder = settings.artifact_root / "job-y" / "sampler" / "run"
    gone = await saved(gone_folder)
    for name in FILES:
        (gone_folder / name).unlink()
    (gone_folder / "tokenizer").rmdir()
    gone_folder.rmdir()
    url = await download_url(client, key, gone["id"])
    missing = await client.get(url, headers=auth(key))
    assert missing.status_code == 404 and "gone" in missing.json()["error"]["message"]


async def test_a_tinker_checkpoint_stays_on_tinker(client, key, saved):
    job = await saved(backend="tinker")
    url = await download_url(client, key, job["id"])
    refused = await client.get(url, headers=auth(key))
    assert refused.status_code == 409 and "tinker" in refused.json()["error"]["message"]


@pytest.fixture
def bucket_client(settings):
    """The API over a bucket (the same database and queue as `client`'s)."""

    @asynccontextmanager
    async def serving():
        with temporary_bucket() as url:
            stored = settings.model_copy(update={"storage_url": url, "storage_retry_seconds": 2})
            async with serve(stored) as http:
                yield http, stored

    return serving


async def test_a_checkpoint_in_the_bucket_comes_as_the_same_archive(
    bucket_client, key, make_key, session, settings, tmp_path, monkeypatch
):
    """A worker uploaded it (no folder of it on the API's disk); the archive is the one a
    local folder of those files gives, and another team gets a 404."""
    folder = tmp_path / "worker" / "run"
    for name, data in FILES.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    async with bucket_client() as (http, stored):
        path = await checkpoint_store(stored).upload(folder, "sampler", "run")
        shutil.rmtree(tmp_path / "worker")
        keys = [o["path"] for batch in obstore.list(storage_of(stored).store) for o in batch]
        assert keys and all(k.startswith("checkpoints/blobs/sha256/") for k in keys)  # apart
        job = (await http.post("/v1/jobs", json=small_spec(), headers=auth(key))).json()
        await claim_job(session, job["id"], "w", heartbeat_timeout=60)
        await record_checkpoint(session, job["id"], "w", 2, "sampler", path)
        url = await download_url(http, key, job["id"])

        sent = await http.get(url, headers=auth(key))
        assert sent.status_code == 200, sent.text
        assert sent.headers["x-checkpoint-sha256"] == hashlib.sha256(sent.content).hexdigest()
        with tarfile.open(fileobj=io.BytesIO(sent.content)) as tar:
            unpacked = {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}
        assert unpacked == {f"run/{name}": data for name, data in FILES.items()}
        assert (await http.get(url, headers=auth(await make_key()))).status_code == 404

        # An API whose cache lacks it (another home), with the store not answering: a 503.
        monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")
        away = stored.model_copy(update={"home": tmp_path / "other", "storage_retry_seconds": 0.5})
        async with serve(away, raising=False) as cut_off:
            refused = await cut_off.get(url, headers=auth(key))
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"]["code"] == "storage_unavailable"
