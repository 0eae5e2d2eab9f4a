"""Helpers shared by the test folders: the real Postgres and Redis of the machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
from sqlalchemy import make_url

POSTGRES_ADMIN_URL = os.environ.get(
    "OPD_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)
REDIS_URL = os.environ.get("OPD_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")


@contextmanager
def temporary_postgres_database() -> Iterator[str]:
    """A new, uniquely named, empty Postgres database, dropped afterwards."""
    name = f"opd_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield make_url(POSTGRES_ADMIN_URL).set(database=name).render_as_string(False)
    finally:
        with psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


@contextmanager
def migrated_database(
    kind: str, folder: Path, prepare: Callable[[str], None] | None = None
) -> Iterator[str]:
    """A fresh database of `kind` (`sqlite`: a file in `folder`; `postgres`: a temporary
    database), migrated to the latest schema for tests that look at every row there is, or
    made ready by `prepare(url)` instead (a migration's test: an older revision, filled)."""
    from app.core.db import migrate

    prepare = prepare or migrate
    if kind == "sqlite":
        url = f"sqlite:///{folder / 'opd.db'}"
        prepare(url)
        yield url
        return
    with temporary_postgres_database() as url:
        prepare(url)
        yield url


REFERENCE_NAMES: dict[str, Any] = {
    "backend": "trio",
    "student": {"base_model": "Qwen/Qwen3.5-4B"},
    "teacher": {"base_model": "Qwen/Qwen3.6-27B"},
    "dataset": {"source": "deepmath"},
}
"""What the reference job trains (examples/deepmath-trio.yaml): what specs left out before a
spec had to name it."""


def named(data: Mapping[str, Any]) -> dict[str, Any]:
    """`data` with what a spec must name and it leaves out taken from the reference job: its
    backend, a `student` / `teacher` group's base_model, its dataset (unless `teachers` /
    `datasets` are given). For tests about something else than what a spec names."""
    spec = dict(data)
    spec.setdefault("backend", REFERENCE_NAMES["backend"])
    spec["student"] = REFERENCE_NAMES["student"] | (spec.get("student") or {})
    if spec.get("teachers") is None:
        spec["teacher"] = REFERENCE_NAMES["teacher"] | (spec.get("teacher") or {})
    if spec.get("datasets") is None and spec.get("dataset") is None:
        spec["dataset"] = REFERENCE_NAMES["dataset"]
    return spec


def assert_close(actual: Any, expected: Any, *, rtol: float = 1e-5, what: str = "") -> None:
    """`actual` equals `expected` up to float rounding, judged on the whole tensor:
    ||actual - expected|| <= rtol * ||expected||. Element-wise tolerances fail on tiny
    entries whose last bits differ between CPUs (AVX-512 or not, Intel or AMD)."""
    a = np.asarray(to_numbers(actual), dtype=np.float64)
    b = np.asarray(to_numbers(expected), dtype=np.float64)
    assert a.shape == b.shape, f"{what}: shape {a.shape} != {b.shape}"
    error = float(np.linalg.norm(a - b))
    scale = float(np.linalg.norm(b))
    assert error <= rtol * scale, (
        f"{what}: |actual - expected| = {error:.3g} > {rtol:g} * |expected| = {rtol * scale:.3g} "
        f"(largest element difference {float(np.abs(a - b).max(initial=0.0)):.3g})"
    )


def to_numbers(value: Any) -> Any:
    """A tensor (any device or dtype), array or nested list as plain numbers."""
    if hasattr(value, "detach"):
        return value.detach().double().cpu().numpy()
    return value


WITHOUT_PEFT = """
import json, sys
sys.modules["peft"] = None  # `import peft` fails, and transformers finds no peft
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
folder, asked = sys.argv[1], json.loads(sys.argv[2])
tokenizer = AutoTokenizer.from_pretrained(folder)
model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
ids = asked.get("ids") or tokenizer.encode(asked["text"], add_special_tokens=False)
with torch.inference_mode():
    logprobs = model(input_ids=torch.tensor([ids])).logits[0].float().log_softmax(-1)
scores = [logprobs[i, ids[i + 1]].item() for i in range(len(ids) - 1)]
print(json.dumps({"ids": ids, "scores": scores}))
"""


def score_without_peft(
    folder: Path, text: str | None = None, ids: list[int] | None = None
) -> tuple[list[int], list[float]]:
    """Load a Hugging Face model folder in a Python where peft cannot be imported, and
    score `text` (or the tokens `ids`) with it: (its token ids, each token's logprob after
    the first)."""
    asked = {"ids": ids} if ids is not None else {"text": text}
    loaded = subprocess.run(
        [sys.executable, "-c", WITHOUT_PEFT, str(folder), json.dumps(asked)],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    answer = json.loads(loaded.stdout.strip().splitlines()[-1])
    return answer["ids"], answer["scores"]


def shared_model_cache(tmp_path_factory: Any) -> Path:
    """One model cache (converted GGUF models) for the whole test run: the xdist workers of
    a run share it (the cache's lock lets one convert while the others wait), and a run
    without xdist keeps its own; never the user's."""
    base = tmp_path_factory.getbasetemp()
    return (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "model-cache"


def converted_smollm2(tmp_path_factory: Any) -> Path:
    """The shared model cache, with smollm2-135m-instruct converted in it (once a run)."""
    from kernel.model_names import SMOLLM2
    from worker.engine.backends.local.gguf import converted
    from worker.engine.backends.local.packaged import packaged_file

    cache = shared_model_cache(tmp_path_factory)
    converted(packaged_file(SMOLLM2), cache)
    return cache


S3_ENDPOINT = os.environ.get("OPD_TEST_S3_URL", "http://127.0.0.1:5055")
"""moto's standalone S3 server (`moto_server`, from moto[server]); scripts/test.sh starts it."""
S3_ENV = {
    "AWS_ENDPOINT_URL": S3_ENDPOINT,
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_REGION": "us-east-1",
}


@contextmanager
def temporary_bucket() -> Iterator[str]:
    """A new bucket on the test S3 server, as an OPD_STORAGE_URL (`s3://bucket/opd`); the
    AWS_* variables that reach it are set while it lives, and it is emptied and removed
    afterwards."""
    import boto3

    saved = {name: os.environ.get(name) for name in S3_ENV}
    os.environ.update(S3_ENV)
    s3 = boto3.client("s3", endpoint_url=S3_ENDPOINT, region_name="us-east-1")
    bucket = f"opd-test-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=bucket)
    try:
        yield f"s3://{bucket}/opd"
    finally:
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
            for item in page.get("Contents", []):
                s3.delete_object(Bucket=bucket, Key=item["Key"])
        s3.delete_bucket(Bucket=bucket)
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextmanager
def temporary_storage(kind: str, folder: Path) -> Iterator[Any]:
    """A Storage of `kind`: `folder` (under `folder`) or `s3` (a temporary bucket)."""
    from kernel.storage.blobs import open_storage

    if kind == "folder":
        yield open_storage(str(folder / "store"))
        return
    with temporary_bucket() as url:
        yield open_storage(url, retry_seconds=2)
