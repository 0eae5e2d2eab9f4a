"""The local backend with its checkpoints in a bucket (moto's S3 server): a checkpoint is
named only once every object is stored, and another worker (another artifact folder and
cache) resumes, continues and samples from it as from a local folder."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import obstore
import pytest
import torch
from pytrio.types import ModelInput
from safetensors.torch import load_file

from kernel.storage.blobs import (
    BlobCorrupt,
    Storage,
    StorageUnavailable,
    blob_key,
    open_storage,
)
from kernel.storage.checkpoints import CheckpointStore, is_stored, manifest_sha256
from tests.support import temporary_bucket
from tests.worker.engine.backends.test_local_state import PROMPTS, Recorder, spec
from worker.engine.backends.local import LocalServiceClient
from worker.engine.backends.stored import StoredService
from worker.engine.data.prompts import Prompts
from worker.engine.loop.state import SavedState
from worker.engine.loop.steps import run_loop

KEYS = ("opd/reverse_kl_mean", "trainer/loss_sum", "data/completion_tokens_total")


@pytest.fixture
def bucket():
    with temporary_bucket() as url:
        yield open_storage(url, retry_seconds=2)


def worker(home: Path, storage, max_bytes: int = 1 << 30) -> tuple[CheckpointStore, Path]:
    """One worker's store view (its own cache) and artifact folder."""
    return CheckpointStore(storage, home / "cache", max_bytes), home / "artifacts"


async def run(store: CheckpointStore, artifacts: Path, resume: SavedState | None = None):
    recorder = Recorder()
    service = StoredService(LocalServiceClient(spec().local, artifacts), store)
    recorder.result = await run_loop(
        spec(), service, Prompts(PROMPTS, [None] * len(PROMPTS)), recorder, resume=resume
    )
    return recorder


async def test_another_worker_resumes_from_the_bucket_with_the_same_curve(tmp_path, bucket):
    first_store, first_artifacts = worker(tmp_path / "a", bucket)
    whole = await run(first_store, first_artifacts)
    assert all(is_stored(path) for path in whole.checkpoints.values())
    manifest = json.loads(
        bytes(
            obstore.get(
                bucket.store, blob_key(manifest_sha256(whole.checkpoints[2, "state"]))
            ).bytes()
        )
    )
    assert {"adapter_model.safetensors", "optimizer.pt", "manifest.json"} <= {
        entry["path"] for entry in manifest["files"]
    }

    second_store, second_artifacts = worker(tmp_path / "b", bucket)
    resumed = await run(
        second_store, second_artifacts, SavedState(whole.checkpoints[2, "state"], 2)
    )
    assert sorted(resumed.metrics) == [2, 3, 4, 5]
    for step in resumed.metrics:
        for key in KEYS:
            assert resumed.metrics[step][key] == whole.metrics[step][key], (step, key)
    finals = [
        load_file(Path(store.local(r.checkpoints[6, "final"])) / "adapter_model.safetensors")
        for store, r in ((first_store, whole), (second_store, resumed))
    ]
    assert finals[0].keys() == finals[1].keys() and finals[0]
    assert all(torch.equal(finals[0][k], finals[1][k]) for k in finals[0])
    assert (tmp_path / "b" / "cache" / manifest_sha256(whole.checkpoints[2, "state"])).is_dir()


async def test_a_teacher_and_a_sampler_load_stored_weights_on_a_fresh_worker(tmp_path, bucket):
    store, artifacts = worker(tmp_path / "a", bucket)
    whole = await run(store, artifacts)
    fresh, fresh_artifacts = worker(tmp_path / "c", bucket)
    service = StoredService(LocalServiceClient(spec().local, fresh_artifacts), fresh)
    sampler = await service.create_sampling_client_async(
        base_model="tiny-student", model_path=whole.checkpoints[6, "final"]
    )
    plain = await LocalServiceClient(spec().local, artifacts).create_sampling_client_async(
        base_model="tiny-student", model_path=store.local(whole.checkpoints[6, "final"])
    )
    prompt = plain.tokenizer.encode("What is 2 + 3?")
    expected = await plain.compute_logprobs_async(ModelInput.from_ints(prompt))
    actual = await sampler.compute_logprobs_async(ModelInput.from_ints(prompt))
    assert actual == expected


async def test_a_damaged_object_is_never_loaded(tmp_path, bucket):
    store, artifacts = worker(tmp_path / "a", bucket)
    saved = await run(store, artifacts)
    path = saved.checkpoints[2, "state"]
    entry = next(e for e in store.files(path) if e["path"] == "optimizer.pt")
    await obstore.put_async(bucket.store, blob_key(entry["sha256"]), b"not the optimizer")
    reader, _ = worker(tmp_path / "d", bucket)
    with pytest.raises(BlobCorrupt):
        await asyncio.to_thread(reader.local, path)
    assert [p.name for p in (tmp_path / "d" / "cache").iterdir()] == []


async def test_an_interrupted_upload_names_no_checkpoint(tmp_path, bucket, monkeypatch):
    """The manifest goes last: a store that fails before it leaves objects no manifest
    lists and no name to record; the next try completes it."""
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "a.bin").write_bytes(b"a" * 1000)
    (folder / "b.bin").write_bytes(b"b" * 1000)
    put_file, sent = Storage.put_file, []

    async def away_at_the_manifest(self: Storage, path: Path, sha256: str) -> bool:
        if path.name == "manifest":
            raise StorageUnavailable("the object store did not complete writing: refused")
        sent.append(path.name)
        return await put_file(self, path, sha256)

    monkeypatch.setattr(Storage, "put_file", away_at_the_manifest)
    store = CheckpointStore(bucket, tmp_path / "cache", 1 << 20)
    with pytest.raises(StorageUnavailable):
        await store.upload(folder, "state", "x")
    stored = [o["path"] for batch in obstore.list(bucket.store) for o in batch]
    assert sorted(sent) == ["a.bin", "b.bin"] and len(stored) == 2

    monkeypatch.setattr(Storage, "put_file", put_file)
    name = await store.upload(folder, "state", "x")
    assert len([o for batch in obstore.list(bucket.store) for o in batch]) == 3
    copy = Path(await asyncio.to_thread(store.local, name))
    assert sorted(p.name for p in copy.iterdir()) == ["a.bin", "b.bin"]


def test_the_cache_keeps_its_budget_and_the_checkpoint_just_read(tmp_path, bucket):
    names = []
    for index in range(3):
        folder = tmp_path / f"c{index}"
        folder.mkdir()
        (folder / "w.bin").write_bytes(bytes([index]) * 4000)
        names.append(
            asyncio.run(CheckpointStore(bucket, tmp_path / "x", 1).upload(folder, "state", "w"))
        )
    store = CheckpointStore(bucket, tmp_path / "cache", 9000)
    for name in names:
        store.local(name)
    kept = sorted(p.name for p in (tmp_path / "cache").iterdir())
    assert kept == sorted(manifest_sha256(n) for n in names[1:])
