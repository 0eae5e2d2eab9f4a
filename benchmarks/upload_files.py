"""Upload throughput of `POST /v1/files`: a generated JSONL of `--mb` MB sent by the SDK
(`client.files.upload`, streamed from disk) to a real `opd api` on the loopback, which
spools it, checks it (UTF-8, parses, counts the questions), and puts it in the store
(`--storage-url`: a folder by default, or an s3:// bucket with the usual AWS_* variables).
Then the same bytes again: the team's file comes back without a second check or copy.
Also reports the API process's peak memory (its RSS, sampled), which the body never fills.

    python benchmarks/upload_files.py                        # 200 MB into a folder
    AWS_ENDPOINT_URL=http://127.0.0.1:5055 AWS_ACCESS_KEY_ID=testing \\
      AWS_SECRET_ACCESS_KEY=testing AWS_REGION=us-east-1 \\
      python benchmarks/upload_files.py --storage-url s3://bucket/opd
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil
from harness import BenchmarkError, positive, progress, run_benchmark
from support import free_port, wait_until_healthy

from opd.sdk import Client

MB = 1_000_000


def write_jsonl(path: Path, megabytes: float) -> int:
    """Distinct arithmetic questions with answers and some padding, until `megabytes`."""
    pad = "x" * 200
    rows, size, target = 0, 0, int(megabytes * MB)
    with path.open("w", encoding="utf-8") as out:
        while size < target:
            line = json.dumps(
                {"question": f"What is {rows} + 1?", "answer": str(rows + 1), "note": pad}
            )
            out.write(line + "\n")
            size += len(line) + 1
            rows += 1
    return rows


def peak_rss(pid: int, stop: threading.Event, peak: list[int]) -> None:
    process = psutil.Process(pid)
    while not stop.wait(0.05):
        try:
            peak[0] = max(peak[0], process.memory_info().rss)
        except psutil.Error:
            return


def benchmark(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="opd-upload-") as folder:
        home = Path(folder)
        env = os.environ | {
            "OPD_HOME": str(home),
            "OPD_MAX_UPLOAD_BYTES": str(int(args.mb * MB * 2) + MB),
            "OPD_TEAM_MAX_FILE_BYTES": str(int(args.mb * MB * 4) + MB),
            **({"OPD_STORAGE_URL": args.storage_url} if args.storage_url else {}),
        }
        opd = [sys.executable, "-m", "opd.cli"]
        subprocess.run([*opd, "migrate"], env=env, check=True, capture_output=True)
        key = subprocess.run(
            [*opd, "keys", "create", "--team", "bench"],
            env=env,
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        data = home / "big.jsonl"
        progress(f"writing {args.mb:g} MB of JSONL")
        rows = write_jsonl(data, args.mb)
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        with (home / "api.log").open("wb") as log:
            api = subprocess.Popen(
                [*opd, "api", "--port", str(port), "--quiet"],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        try:
            try:
                wait_until_healthy(url, api, 60, "the API")
            except RuntimeError as error:
                raise BenchmarkError(f"{error}\n{(home / 'api.log').read_text()[-2000:]}") from None
            idle_rss = psutil.Process(api.pid).memory_info().rss
            stop, peak = threading.Event(), [idle_rss]
            watcher = threading.Thread(target=peak_rss, args=(api.pid, stop, peak), daemon=True)
            watcher.start()
            with Client(url, key, timeout=600) as client:
                progress("uploading")
                started = time.perf_counter()
                file = client.files.upload(data, progress=False)
                first = time.perf_counter() - started
                started = time.perf_counter()
                again = client.files.upload(data, progress=False)
                second = time.perf_counter() - started
            stop.set()
            watcher.join()
        finally:
            api.terminate()
            api.wait(30)
        if file.rows != rows or again.id != file.id:
            raise BenchmarkError(
                f"the API counted {file.rows} rows of {rows}, or made a second file"
            )
        size = data.stat().st_size
        return {
            "bytes": size,
            "rows": rows,
            "store": args.storage_url or "folder",
            "first_seconds": first,
            "first_mb_per_second": size / MB / first,
            "again_seconds": second,
            "again_mb_per_second": size / MB / second,
            "api_idle_rss_mb": idle_rss / MB,
            "api_peak_rss_mb": peak[0] / MB,
        }


def report(figures: dict[str, Any]) -> str:
    size, rows, store = figures["bytes"] / MB, figures["rows"], figures["store"]
    idle, peak = figures["api_idle_rss_mb"], figures["api_peak_rss_mb"]
    return "\n".join(
        [
            f"upload of {size:.0f} MB JSONL ({rows} rows) into {store}",
            f"first:  {figures['first_seconds']:.2f} s = {figures['first_mb_per_second']:.0f} MB/s "
            "(spooled, checked, stored)",
            f"again:  {figures['again_seconds']:.2f} s = {figures['again_mb_per_second']:.0f} MB/s "
            "(the same bytes: the team's file answers)",
            f"API RSS: {idle:.0f} MB idle, {peak:.0f} MB peak",
        ]
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=positive(float), default=200.0, help="size of the JSONL")
    parser.add_argument("--storage-url", help="OPD_STORAGE_URL (default: a folder in the home)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    return run_benchmark(benchmark, report, parser.parse_args())


if __name__ == "__main__":
    sys.exit(main())
