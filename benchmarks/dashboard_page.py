"""The dashboard's job page for a long job: server time and page weight.

Fills a running job with 20,000 steps (the real write path, `record_step`, with the 14
metric names a local job records), starts `opd api` on it, signs in, then measures
1. server time: GET /ui/jobs/{id} (the HTML), GET /ui/jobs (the table) and the curves
   request the page's charts make, each `--requests` times, on the loopback;
2. page weight: the page loaded in headless Chromium, every response's transferred bytes
   (headers + encoded body), by resource, until the charts are drawn.

    python benchmarks/dashboard_page.py                 # SQLite, 20,000 steps
    python benchmarks/dashboard_page.py --database postgres --steps 5000 --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx
from api_load import sample_metrics
from harness import postgres_database, progress
from support import free_port, percentile, wait_until_healthy

from app.auth.keys import create_key
from app.auth.schemas import Scope
from app.core.db import migrate, standalone_session
from app.jobs.schemas import CheckpointKind
from app.jobs.store import claim_job, create_job
from app.records.store import record_checkpoint, record_step
from kernel.spec import JobSpec

ROOT = Path(__file__).resolve().parents[1]
WRITER = "benchmark-writer"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
CHECKPOINT_EVERY = 500
STARTUP_SECONDS = 60.0
CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')


async def fill(database_url: str, steps: int) -> tuple[str, int]:
    """An admin key and a running job with `steps` steps (and a checkpoint every 500)."""
    async with standalone_session(database_url) as session:
        key = (await create_key(session, "benchmark", scope=Scope.admin)).key
        spec = JobSpec.model_validate(
            {
                "name": "long-job",
                "backend": "local",
                "student": {"base_model": "tiny-student"},
                "teacher": {"base_model": "tiny-teacher"},
                "dataset": {"source": "inline", "prompts": ["What is 1 + 1?"]},
                "loop": {"steps": steps},
            }
        )
        job = (await create_job(session, 1, spec)).job
        await claim_job(session, job.id, WRITER, heartbeat_timeout=3600)
        began = time.perf_counter()
        for step in range(steps):
            await record_step(session, job.id, WRITER, step, sample_metrics(step))
            if (step + 1) % CHECKPOINT_EVERY == 0:
                path = f"/artifacts/job-{job.id}/state/long-job-state-{step + 1:06d}"
                await record_checkpoint(session, job.id, WRITER, step, CheckpointKind.state, path)
            if (step + 1) % 5000 == 0:
                rate = (step + 1) / (time.perf_counter() - began)
                progress(f"{step + 1} steps written ({rate:.0f}/s)")
    return key, job.id


@contextmanager
def database(kind: str, folder: Path) -> Iterator[str]:
    if kind == "sqlite":
        yield f"sqlite:///{folder / 'opd.db'}"
    else:
        with postgres_database() as url:
            yield url


@contextmanager
def api(database_url: str, home: Path) -> Iterator[str]:
    """`opd api` on a free port, stopped on the way out."""
    port = free_port()
    env = os.environ | {
        "PYTHONPATH": str(ROOT),
        "OPD_HOME": str(home),
        "OPD_DATABASE_URL": database_url,
        "OPD_REDIS_URL": "redis://127.0.0.1:1/0",  # the page needs no queue
        "OPD_MIGRATE_ON_START": "false",
    }
    log = (home / "api.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "opd.cli", "api", "--port", str(port), "--quiet"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(url, process, STARTUP_SECONDS, f"opd api (see {home / 'api.log'})")
        yield url
    finally:
        process.terminate()
        process.wait(30)


def signed_in(url: str, key: str) -> httpx.Client:
    client = httpx.Client(base_url=url, timeout=60)
    page = client.get("/ui/sign-in")
    token = CSRF.search(page.text).group(1)  # type: ignore[union-attr]
    signed = client.post("/ui/sign-in", data={"csrf_token": token, "key": key})
    assert signed.status_code == 303, signed.text
    return client


def timings(client: httpx.Client, path: str, requests: int) -> dict[str, Any]:
    """Loopback time of `requests` GETs (one warm-up first), in ms, and the body size."""
    assert client.get(path).status_code == 200
    seconds, size = [], 0
    for _ in range(requests):
        began = time.perf_counter()
        response = client.get(path)
        seconds.append(time.perf_counter() - began)
        assert response.status_code == 200, response.status_code
        size = len(response.content)
    ms = [s * 1000 for s in seconds]
    return {
        "p50_ms": percentile(ms, 0.5),
        "p95_ms": percentile(ms, 0.95),
        "max_ms": max(ms),
        "bytes": size,
    }


def page_weight(url: str, key: str, job_id: int) -> dict[str, Any]:
    """Bytes transferred (headers + encoded bodies) loading the job page in Chromium until
    its charts are drawn, in a profile with nothing cached. The metrics stream of the
    running job stays open (no step arrives here), so it is not among the responses."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        page = browser.new_page()
        page.goto(f"{url}/ui/sign-in")
        page.fill("#key", key)
        page.click("form[action='/ui/sign-in'] button[type=submit]")
        page.wait_for_url(re.compile(r"/ui/jobs$"))
        # A fresh profile with only the session cookie: nothing cached, a first visit.
        cold = browser.new_context(storage_state=page.context.storage_state())
        page = cold.new_page()
        finished: list[Any] = []
        page.on("requestfinished", lambda request: finished.append(request))
        began = time.perf_counter()
        page.goto(f"{url}/ui/jobs/{job_id}")
        chart = page.locator("#chart-reverse-kl")
        chart.wait_for()
        deadline = time.monotonic() + 60
        while not chart.get_attribute("data-points"):
            if time.monotonic() > deadline:
                raise RuntimeError("the charts were not drawn")
            page.wait_for_timeout(20)
        drawn_ms = (time.perf_counter() - began) * 1000
        resources = []
        for request in finished:
            sizes = request.sizes()
            transferred = sizes["responseHeadersSize"] + sizes["responseBodySize"]
            resources.append({"url": request.url.removeprefix(url), "bytes": transferred})
        points = int(chart.get_attribute("data-points") or 0)
        browser.close()
    return {
        "charts_drawn_ms": drawn_ms,
        "reverse_kl_points": points,
        "total_bytes": sum(r["bytes"] for r in resources),
        "resources": resources,
    }


def curves_path(client: httpx.Client, job_id: int) -> str:
    """The curves request the job page's charts make (keys from the page's config)."""
    page = client.get(f"/ui/jobs/{job_id}").text
    config = json.loads(re.search(r'id="chart-config">(.*?)</script>', page).group(1))  # type: ignore[union-attr]
    keys = ",".join(config["keys"])
    return f"/v1/jobs/{job_id}/metrics?keys={keys}&max_points={config['max_points']}"


def kb(size: float) -> str:
    return f"{size / 1024:.1f} KB"


def report(result: dict[str, Any]) -> str:
    lines = [
        f"Job page of a {result['steps']:,}-step running job ({result['database']}, "
        f"{result['requests']} requests each, loopback):",
    ]
    for name, figures in result["server"].items():
        lines.append(
            f"  {name:<28} p50 {figures['p50_ms']:.1f} ms, p95 {figures['p95_ms']:.1f} ms, "
            f"max {figures['max_ms']:.1f} ms, body {kb(figures['bytes'])}"
        )
    weight = result["weight"]
    lines.append(
        f"  page weight (first load, Chromium): {kb(weight['total_bytes'])} in "
        f"{len(weight['resources'])} responses; charts drawn after "
        f"{weight['charts_drawn_ms']:.0f} ms ({weight['reverse_kl_points']} reverse-KL points)"
    )
    for resource in sorted(weight["resources"], key=lambda r: -r["bytes"]):
        lines.append(f"    {kb(resource['bytes']):>9}  {resource['url'][:90]}")
    return "\n".join(lines)


def benchmark(args: argparse.Namespace) -> dict[str, Any]:
    with ExitStack() as stack:
        home = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="opd-dash-")))
        url = stack.enter_context(database(args.database, home))
        migrate(url)
        progress(f"writing {args.steps:,} steps to {args.database}")
        key, job_id = asyncio.run(fill(url, args.steps))
        base = stack.enter_context(api(url, home))
        client = signed_in(base, key)
        stack.callback(client.close)
        server = {
            "job page (HTML)": timings(client, f"/ui/jobs/{job_id}", args.requests),
            "jobs table (HTML)": timings(client, "/ui/jobs", args.requests),
            "chart curves (JSON)": timings(client, curves_path(client, job_id), args.requests),
        }
        progress("loading the page in Chromium")
        weight = page_weight(base, key, job_id)
    return {
        "database": args.database,
        "steps": args.steps,
        "requests": args.requests,
        "server": server,
        "weight": weight,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--database", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--requests", type=int, default=30)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    result = benchmark(args)
    print(report(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
