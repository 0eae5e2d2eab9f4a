"""load_prompts on files the tests write, with DeepMath shards served from this machine."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import worker.engine.data.datasets
from kernel.errors import DatasetUnavailable, OPDError
from kernel.spec import DeepMathDataset, FileDataset, InlineDataset
from kernel.storage.blobs import Storage
from kernel.storage.cache import BlobCache
from kernel.storage.hashing import file_sha256
from tests.hostile_uploads import deep_jsonl
from tests.support import temporary_storage
from worker.engine.data.datasets import load_holdout, load_prompts
from worker.engine.data.prompts import Prompts

QUESTIONS = [f"question {i}" for i in range(20)]


def write_parquet(path: Path, columns: dict[str, list]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(columns), path)
    return path


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def reference_order(values: list[str], seed: int, sample_size: int | None) -> list[str]:
    """What `Dataset.shuffle(seed=seed).select(range(sample_size))` keeps, worked out
    independently: datasets permutes with numpy's default_rng(seed)."""
    order = [values[i] for i in np.random.default_rng(seed).permutation(len(values))]
    return order[:sample_size]


@pytest.fixture
def root(tmp_path: Path) -> Path:
    data_root = tmp_path / "root"
    data_root.mkdir()
    return data_root


# Local files.


def test_parquet_prompts_come_from_the_named_field(root: Path) -> None:
    write_parquet(root / "math.parquet", {"problem": QUESTIONS, "answer": ["1"] * 20})

    prompts = load_prompts(
        FileDataset(path="math.parquet", field="problem", seed=3), root, True
    ).prompts

    assert prompts == reference_order(QUESTIONS, seed=3, sample_size=None)


def test_jsonl_prompts_come_from_the_named_field(root: Path) -> None:
    write_jsonl(root / "sub" / "math.jsonl", [{"q": q, "a": 1} for q in QUESTIONS])

    prompts = load_prompts(
        FileDataset(path="sub/math.jsonl", field="q", seed=5), root, True
    ).prompts

    assert prompts == reference_order(QUESTIONS, seed=5, sample_size=None)


def test_shuffle_is_deterministic_and_sample_size_keeps_the_first_rows(root: Path) -> None:
    write_parquet(root / "math.parquet", {"question": QUESTIONS})

    def load(seed: int, sample_size: int | None) -> list[str]:
        dataset = FileDataset(path="math.parquet", seed=seed, sample_size=sample_size)
        return load_prompts(dataset, root, True).prompts

    assert load(42, 5) == load(42, 5) == reference_order(QUESTIONS, 42, 5)
    assert load(42, 5) == load(42, None)[:5]
    assert load(7, 5) != load(42, 5)
    assert sorted(load(42, 1000)) == sorted(QUESTIONS)


def test_missing_field_error_lists_the_columns(root: Path) -> None:
    write_jsonl(root / "math.jsonl", [{"problem": "1+1", "answer": "2"}])

    with pytest.raises(OPDError, match=r"no column 'question'.*\['problem', 'answer'\]") as caught:
        load_prompts(FileDataset(path="math.jsonl"), root, True)
    assert caught.value.code == "bad_dataset"


def test_a_non_text_field_is_refused(root: Path) -> None:
    write_parquet(root / "math.parquet", {"question": [1, 2, 3]})

    with pytest.raises(OPDError, match="not text"):
        load_prompts(FileDataset(path="math.parquet"), root, True)


def test_null_and_blank_prompts_are_dropped_before_shuffling(root: Path) -> None:
    dirty = [*QUESTIONS[:10], None, "   ", *QUESTIONS[10:]]
    write_parquet(root / "dirty.parquet", {"question": dirty})

    prompts = load_prompts(FileDataset(path="dirty.parquet", sample_size=8), root, True).prompts

    assert prompts == reference_order(QUESTIONS, seed=42, sample_size=8)


def test_a_source_without_any_prompt_is_refused(root: Path) -> None:
    write_jsonl(root / "empty.jsonl", [{"question": None}, {"question": " "}])

    with pytest.raises(OPDError, match="no non-empty prompts"):
        load_prompts(FileDataset(path="empty.jsonl"), root, True)


def test_inline_prompts_keep_their_order(root: Path) -> None:
    dataset = InlineDataset(prompts=["c", "a", " ", "b"])

    assert load_prompts(dataset, root, True).prompts == ["c", "a", "b"]


def test_missing_file_names_the_path(root: Path) -> None:
    with pytest.raises(DatasetUnavailable, match=r"'nope/math\.jsonl' does not exist"):
        load_prompts(FileDataset(path="nope/math.jsonl"), root, True)


def test_unreadable_file_is_unavailable(root: Path) -> None:
    (root / "broken.parquet").write_bytes(b"not parquet at all")

    with pytest.raises(DatasetUnavailable, match=r"cannot read broken\.parquet"):
        load_prompts(FileDataset(path="broken.parquet"), root, True)


def test_unsupported_suffix_is_refused(root: Path) -> None:
    (root / "math.csv").write_text("question\n1+1\n")

    with pytest.raises(OPDError, match=r"not a \.parquet, \.jsonl or \.json file"):
        load_prompts(FileDataset(path="math.csv"), root, True)


# Confinement to the data root.


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    return write_jsonl(tmp_path / "secret" / "math.jsonl", [{"question": "private"}])


@pytest.mark.parametrize("escape", ["../secret/math.jsonl", "sub/../../secret/math.jsonl"])
def test_dot_dot_cannot_leave_the_data_root(root: Path, outside: Path, escape: str) -> None:
    with pytest.raises(OPDError, match="outside the server's data root") as caught:
        load_prompts(FileDataset(path=escape), root, confine=True)
    assert caught.value.code == "bad_dataset_path"


def test_absolute_path_outside_the_root_is_refused(root: Path, outside: Path) -> None:
    with pytest.raises(OPDError, match="outside the server's data root"):
        load_prompts(FileDataset(path=str(outside)), root, confine=True)


def test_symlink_out_of_the_root_is_refused(root: Path, outside: Path) -> None:
    (root / "link.jsonl").symlink_to(outside)
    (root / "linkdir").symlink_to(outside.parent, target_is_directory=True)

    for path in ("link.jsonl", "linkdir/math.jsonl"):
        with pytest.raises(OPDError, match="outside the server's data root"):
            load_prompts(FileDataset(path=path), root, confine=True)


def test_refusal_does_not_reveal_whether_an_outside_file_exists(root: Path) -> None:
    with pytest.raises(OPDError, match="outside the server's data root"):
        load_prompts(FileDataset(path="../no/such/file.jsonl"), root, confine=True)


def test_paths_inside_the_root_are_accepted(root: Path) -> None:
    inside = write_jsonl(root / "a" / "math.jsonl", [{"question": "inside"}])
    (root / "alias.jsonl").symlink_to(inside)

    for path in (str(inside), "a/math.jsonl", "a/../a/math.jsonl", "alias.jsonl"):
        assert load_prompts(FileDataset(path=path), root, confine=True).prompts == ["inside"]


def test_without_confinement_any_path_is_read(root: Path, outside: Path) -> None:
    assert load_prompts(FileDataset(path=str(outside)), root, confine=False).prompts == ["private"]
    assert load_prompts(FileDataset(path="../secret/math.jsonl"), root, False).prompts == [
        "private"
    ]


# DeepMath: shards in the cache folder, or fetched from a server on this machine.


def shard(root: Path, index: int) -> Path:
    return root / "datasets" / "DeepMath-103K" / f"data/train-{index:05d}-of-00010.parquet"


@pytest.fixture
def closed_port_base(monkeypatch: pytest.MonkeyPatch) -> str:
    """ModelScope moved to a local port that nothing listens on: any download fails."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    base = f"http://127.0.0.1:{port}"
    monkeypatch.setenv("no_proxy", "127.0.0.1")
    monkeypatch.setattr(worker.engine.data.datasets, "MODELSCOPE_BASE", base)
    return base


def test_deepmath_reuses_finished_shards_without_downloading(
    root: Path, closed_port_base: str
) -> None:
    write_parquet(shard(root, 0), {"question": QUESTIONS[:10], "answer": ["x"] * 10})
    write_parquet(shard(root, 1), {"question": QUESTIONS[10:], "answer": ["y"] * 10})

    prompts = load_prompts(DeepMathDataset(num_shards=2, sample_size=6, seed=1), root, True).prompts

    assert prompts == reference_order(QUESTIONS, seed=1, sample_size=6)


@pytest.mark.parametrize("leftover", [".tmp", ".1234.tmp"])
def test_deepmath_does_not_take_a_leftover_tmp_for_a_shard(
    root: Path, closed_port_base: str, leftover: str
) -> None:
    write_parquet(shard(root, 0), {"question": QUESTIONS})
    partial = shard(root, 1).with_name(shard(root, 1).name + leftover)
    write_parquet(partial, {"question": QUESTIONS})

    with pytest.raises(DatasetUnavailable, match=r"train-00001-of-00010\.parquet"):
        load_prompts(DeepMathDataset(num_shards=2), root, True)


def test_deepmath_download_failure_says_what_to_do(root: Path, closed_port_base: str) -> None:
    with pytest.raises(DatasetUnavailable) as caught:
        load_prompts(DeepMathDataset(), root, True)

    message = str(caught.value)
    assert "cannot download DeepMath shard train-00000-of-00010.parquet from 127.0.0.1" in message
    assert "Check that this machine can reach 127.0.0.1" in message
    assert str(root) not in message, "the server's path means nothing to a remote team"
    assert "place them in the data root's datasets/DeepMath-103K/data folder" in message
    assert "dataset: {source: file, path: ...}" in message
    assert not any(shard(root, 0).parent.glob("*"))


class ShardServer(ThreadingHTTPServer):
    """Serves `body` for every GET and remembers the requested paths."""

    def __init__(self, body: bytes) -> None:
        super().__init__(("127.0.0.1", 0), ShardHandler)
        self.body = body
        self.paths: list[str] = []


class ShardHandler(BaseHTTPRequestHandler):
    server: ShardServer

    def do_GET(self) -> None:
        self.server.paths.append(self.path)
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.server.body)))
        self.end_headers()
        self.wfile.write(self.server.body)

    def log_message(self, format: str, *args: object) -> None:
        """Keep the test output quiet."""


@pytest.fixture
def serve(monkeypatch: pytest.MonkeyPatch) -> Iterator:
    servers: list[ShardServer] = []

    def start(body: bytes) -> ShardServer:
        server = ShardServer(body)
        threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True).start()
        servers.append(server)
        monkeypatch.setenv("no_proxy", "127.0.0.1")
        monkeypatch.setattr(
            worker.engine.data.datasets, "MODELSCOPE_BASE", f"http://127.0.0.1:{server.server_port}"
        )
        return server

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def test_deepmath_downloads_missing_shards_from_the_reference_url(
    root: Path, tmp_path: Path, serve
) -> None:
    body = write_parquet(tmp_path / "remote.parquet", {"question": QUESTIONS}).read_bytes()
    server = serve(body)
    write_parquet(shard(root, 0), {"question": ["already here"]})

    prompts = load_prompts(DeepMathDataset(num_shards=2, sample_size=None), root, True).prompts

    assert sorted(prompts) == sorted([*QUESTIONS, "already here"])
    assert shard(root, 1).read_bytes() == body
    assert len(server.paths) == 1
    url = urlsplit(server.paths[0])
    assert url.path == "/api/v1/datasets/AI-ModelScope/DeepMath-103K/repo"
    assert parse_qs(url.query) == {
        "Source": ["SDK"],
        "Revision": ["master"],
        "FilePath": ["data/train-00001-of-00010.parquet"],
        "View": ["False"],
    }
    assert sorted(p.name for p in shard(root, 1).parent.iterdir()) == [
        shard(root, 0).name,
        shard(root, 1).name,
    ]


def test_other_repos_and_revisions_get_their_own_folder(root: Path, tmp_path: Path, serve) -> None:
    body = write_parquet(tmp_path / "remote.parquet", {"question": ["pinned"]}).read_bytes()
    server = serve(body)
    write_parquet(shard(root, 0), {"question": ["master"]})

    prompts = load_prompts(DeepMathDataset(revision="v1.0"), root, True).prompts

    assert prompts == ["pinned"]
    assert "Revision=v1.0" in server.paths[0]


def test_a_reply_that_is_not_parquet_is_not_kept(root: Path, serve) -> None:
    serve(b'{"Code": 404, "Message": "file not found"}')

    with pytest.raises(DatasetUnavailable, match="did not return a parquet file"):
        load_prompts(DeepMathDataset(), root, True)
    assert not any(shard(root, 0).parent.glob("*"))


# Held-out prompts and reference answers.


def test_answers_come_along_with_their_prompts(root: Path) -> None:
    answers = [f"answer {i}" for i in range(20)]
    write_parquet(root / "math.parquet", {"question": QUESTIONS, "solution": answers})
    dataset = FileDataset(path="math.parquet", answer_field="solution", sample_size=5, seed=4)

    prompts = load_prompts(dataset, root, True)

    assert [q.replace("question", "answer") for q in prompts.prompts] == prompts.answers
    inline = InlineDataset(prompts=["a", " ", "c"], answers=["1", "2", "3"])
    assert load_prompts(inline, root, True) == Prompts(["a", "c"], ["1", "3"])
    assert load_prompts(InlineDataset(prompts=["a"]), root, True).answers == [None]


def test_a_holdout_is_seeded_and_never_meets_the_training_pool(root: Path) -> None:
    answers = [f"answer {i}" for i in range(20)]
    write_parquet(root / "math.parquet", {"question": QUESTIONS, "final": answers})
    dataset = FileDataset(path="math.parquet", answer_field="final", sample_size=12, seed=4)

    pool = load_prompts(dataset, root, True)
    held_out = load_holdout(dataset, 6, 9, root, True)

    assert len(held_out) == 6 and not set(held_out.prompts) & set(pool.prompts)
    assert set(held_out.prompts) | set(pool.prompts) <= set(QUESTIONS)
    assert held_out == load_holdout(dataset, 6, 9, root, True)
    assert held_out != load_holdout(dataset, 6, 10, root, True)
    assert [q.replace("question", "answer") for q in held_out.prompts] == held_out.answers
    with pytest.raises(OPDError, match="has 8 rows outside the training pool") as caught:
        load_holdout(dataset, 9, 9, root, True)
    assert caught.value.code == "bad_eval"
    with pytest.raises(OPDError, match="inline prompts"):
        load_holdout(InlineDataset(prompts=["a", "b"]), 1, 0, root, True)


# Uploaded files, read from the store (a folder, and a bucket of moto's S3 server).


@pytest.fixture(params=["folder", "s3"])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Storage]:
    with temporary_storage(request.param, tmp_path) as storage:
        yield storage


async def stored(storage: Storage, path: Path) -> str:
    sha = file_sha256(path)
    await storage.put_file(path, sha)
    return sha


@pytest.mark.parametrize("suffix", ["jsonl", "csv"])
async def test_an_uploaded_file_is_read_from_the_store_through_the_cache(
    root: Path, tmp_path: Path, storage: Storage, suffix: str
) -> None:
    rows = [{"question": q, "answer": str(i)} for i, q in enumerate(QUESTIONS)]
    if suffix == "jsonl":
        source = write_jsonl(tmp_path / "upload.jsonl", rows)
    else:
        source = tmp_path / "upload.csv"
        source.write_text(
            "question,answer\n" + "".join(f"{r['question']},{r['answer']}\n" for r in rows)
        )
    sha = await stored(storage, source)
    cache = BlobCache(storage, tmp_path / "cache", 1 << 20)
    dataset = FileDataset(file="file-7", blob=f"{sha}.{suffix}", answer_field="answer", seed=5)

    prompts = await asyncio.to_thread(load_prompts, dataset, root, True, cache)
    assert prompts.prompts == reference_order(QUESTIONS, 5, None)
    assert prompts.answers == [str(QUESTIONS.index(q)) for q in prompts.prompts]
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [f"{sha}.{suffix}"]


async def test_an_uploaded_file_gone_from_the_store_is_unavailable(
    root: Path, tmp_path: Path, storage: Storage
) -> None:
    dataset = FileDataset(file="file-7", blob=f"{'1' * 64}.jsonl")
    cache = BlobCache(storage, tmp_path / "cache", 1 << 20)
    with pytest.raises(DatasetUnavailable, match="file-7 is no longer in the store"):
        await asyncio.to_thread(load_prompts, dataset, root, True, cache)


async def test_an_uploaded_file_no_reader_survives_fails_the_job_with_a_code(
    root: Path, tmp_path: Path, storage: Storage
) -> None:
    source = tmp_path / "deep.jsonl"
    source.write_bytes(deep_jsonl())  # Arrow's JSON reader, datasets' too, crashed on it
    sha = await stored(storage, source)
    cache = BlobCache(storage, tmp_path / "cache", 1 << 20)
    dataset = FileDataset(file="file-7", blob=f"{sha}.jsonl")
    with pytest.raises(OPDError, match="line 1 nests objects or lists") as raised:
        await asyncio.to_thread(load_prompts, dataset, root, True, cache)
    assert raised.value.code == "file_too_complex"


def test_an_uploaded_file_outside_the_service_says_how_to_read_a_file(root: Path) -> None:
    with pytest.raises(OPDError, match="only the service's workers") as raised:
        load_prompts(FileDataset(file="file-7"), root, True)
    assert raised.value.code == "bad_dataset"
