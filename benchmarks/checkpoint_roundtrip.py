"""The checkpoint round trip, a bucket against the folder default, side by side in one run:
the local backend saves a training state (LoRA weights and Adam's moments) of `--model`,
then another worker loads it back.

- folder (OPD_STORAGE_URL a folder): save, then load from where it was written (the
  artifact folder every worker shares);
- s3 (OPD_STORAGE_URL s3://): save, upload every file and the manifest, then fetch it
  into a fresh worker's cache (each object checked against its sha256) and load it.

The built-in presets' checkpoints are small (latency dominates); `--pad-mb` adds a file
of random bytes to each saved folder, standing in for a larger model's weights. Without
`--storage-url`, the script starts its own moto S3 server (moto[server]) on a free port.

    python benchmarks/checkpoint_roundtrip.py                   # tiny-student, 5 rounds
    python benchmarks/checkpoint_roundtrip.py --pad-mb 64 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's modules

from harness import BenchmarkError, positive, progress, run_benchmark
from support import free_port, wait_until_healthy

from kernel.spec import LocalBackendSpec
from kernel.storage.blobs import open_storage
from kernel.storage.checkpoints import CheckpointStore
from worker.engine.backends.local import LocalServiceClient
from worker.engine.backends.local.checkpoints import folder_size

MB = 1_000_000
PHASES = ("save", "upload", "fetch", "load")
MOTO_ENV = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench"}


@contextmanager
def moto_bucket(folder: Path) -> Iterator[str]:
    """A bucket on a moto S3 server of this run's own, as an OPD_STORAGE_URL."""
    import boto3

    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    moto = Path(sys.executable).parent / "moto_server"
    with (folder / "moto.log").open("wb") as log:
        server = subprocess.Popen(
            [str(moto), "-H", "127.0.0.1", "-p", str(port)], stdout=log, stderr=log
        )
    try:
        try:
            wait_until_healthy(endpoint, server, 30, "moto_server", path="/moto-api/")
        except RuntimeError as error:
            log = (folder / "moto.log").read_text()
            raise BenchmarkError(f"{error}: {log}") from None
        os.environ.update(MOTO_ENV | {"AWS_ENDPOINT_URL": endpoint, "AWS_REGION": "us-east-1"})
        bucket = f"bench-{uuid.uuid4().hex[:8]}"
        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(
            Bucket=bucket
        )
        yield f"s3://{bucket}/opd"
    finally:
        server.terminate()
        server.wait(30)


async def round_trip(
    service: LocalServiceClient, args: argparse.Namespace, store: CheckpointStore | None, index: int
) -> dict[str, float]:
    """One save and load back (through `store` when given); seconds per phase, and MB."""
    training = await service.create_lora_training_client_async(args.model, rank=args.rank, seed=1)
    started = time.perf_counter()
    saved = await (await training.save_state_async(f"bench-{index}"))
    timings = {"save": time.perf_counter() - started, "upload": 0.0, "fetch": 0.0}
    folder = Path(saved.path)
    if args.pad_mb:
        (folder / "padding.bin").write_bytes(os.urandom(int(args.pad_mb * MB)))
    path = str(folder)
    if store is not None:
        started = time.perf_counter()
        path = await store.upload(folder, "state", f"bench-{index}")
        timings["upload"] = time.perf_counter() - started
        reader = CheckpointStore(store.storage, store.cache / f"reader-{index}", store.max_bytes)
        started = time.perf_counter()
        path = await asyncio.to_thread(reader.local, path)
        timings["fetch"] = time.perf_counter() - started
    fresh = await service.create_lora_training_client_async(args.model, rank=args.rank, seed=2)
    started = time.perf_counter()
    await (await fresh.load_state_with_optimizer_async(path))
    timings["load"] = time.perf_counter() - started
    timings["mb"] = folder_size(Path(path)) / MB
    return timings


async def measure(args: argparse.Namespace, home: Path, url: str | None) -> dict[str, Any]:
    store = None
    if url is not None:
        store = CheckpointStore(open_storage(url), home / "cache", 1 << 40)
    service = LocalServiceClient(LocalBackendSpec(), home / f"artifacts-{url is not None}")
    await round_trip(service, args, store, -1)  # warm-up: model load, first connection
    rounds = [await round_trip(service, args, store, index) for index in range(args.rounds)]
    figures = {phase: statistics.median(r[phase] for r in rounds) for phase in PHASES}
    figures["total"] = statistics.median(sum(r[p] for p in PHASES) for r in rounds)
    figures["mb"] = rounds[0]["mb"]
    return figures


def benchmark(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="opd-ckpt-") as scratch:
        home = Path(scratch)
        progress("folder default")
        folder = asyncio.run(measure(args, home / "folder", None))
        given = nullcontext(args.storage_url) if args.storage_url else None
        with given or moto_bucket(home) as url:
            progress(f"bucket {url}")
            bucket = asyncio.run(measure(args, home / "s3", url))
    runs = {"model": args.model, "rank": args.rank, "rounds": args.rounds}
    return runs | {"folder": folder, "s3": bucket}


def report(figures: dict[str, Any]) -> str:
    head = f"{'store':<7}{'MB':>8}" + "".join(f"{p + ' s':>10}" for p in (*PHASES, "total"))
    lines = [
        f"checkpoint round trip of {figures['model']} (LoRA rank {figures['rank']}), "
        f"median of {figures['rounds']}",
        head,
    ]
    for store in ("folder", "s3"):
        row = figures[store]
        cells = "".join(f"{row[p]:>10.3f}" for p in (*PHASES, "total"))
        lines.append(f"{store:<7}{row['mb']:>8.2f}{cells}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny-student", help="a preset or model folder")
    parser.add_argument("--rank", type=int, default=64, help="LoRA rank (4..64)")
    parser.add_argument("--pad-mb", type=positive(float), help="random MB added per checkpoint")
    parser.add_argument("--rounds", type=int, default=5, help="round trips per store")
    parser.add_argument("--storage-url", help="an s3:// bucket (AWS_* set) instead of moto's")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    return run_benchmark(benchmark, report, parser.parse_args())


if __name__ == "__main__":
    sys.exit(main())
