"""Webhook delivery latency: from a job's change (its `finished_at`) to the receiver.

Starts a throwaway deployment on Postgres (`opd api`, one `opd worker`, the webhook sender
polling every --poll-interval seconds, as shipped: 1 s) and a local receiver that verifies
every Standard Webhooks signature, then measures two kinds of change:

- cancels made by the API (--cancels jobs, cancelled while queued, one every 50 ms): a
  worker's sender finds them at its next look, so they wait up to one poll interval;
- jobs that end on the worker (--jobs tiny jobs): the worker wakes its own sender at once.

Prints p50/p99/max per kind (milliseconds) and exits 1 if an event is missing, arrived
twice or failed its signature check.

    python benchmarks/webhook_latency.py                   # 100 cancels, 10 jobs
    python benchmarks/webhook_latency.py --cancels 20 --jobs 3
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness import latency_summary  # noqa: E402

from tests.e2e.conftest import Service, deployment, tiny_spec  # noqa: E402
from tests.e2e.receiver import Receiver, Server, wait_for  # noqa: E402
from tests.support import temporary_postgres_database  # noqa: E402

LIMITED_TEAM = "latency"


def changed_at(job: dict) -> float:
    return datetime.fromisoformat(job["finished_at"].replace("Z", "+00:00")).timestamp()


def call(service: Service, method: str, path: str, **options) -> dict:
    headers = {"Authorization": f"Bearer {service.key}"}
    response = httpx.request(method, f"{service.url}{path}", headers=headers, timeout=30, **options)
    response.raise_for_status()
    return response.json()


def measure(cancels: int, jobs: int, poll_interval: float) -> dict[str, dict]:
    receiver = Receiver()
    with (
        temporary_postgres_database() as url,
        tempfile.TemporaryDirectory() as home,
        Server(receiver) as server,
        deployment(
            Path(home),
            url,
            webhook_allow_private="true",
            webhook_poll_interval=str(poll_interval),
        ) as service,
    ):
        service.opd("teams", "set", "e2e", "--max-running", "1")
        events = ["job.cancelled", "job.succeeded"]
        receiver.secret = call(
            service, "POST", "/v1/webhooks", json={"url": server.url, "events": events}
        )["secret"]
        service.start_worker()
        blocker = service.submit(tiny_spec(steps=100_000))  # holds the team's one slot
        service.wait(blocker["id"], lambda job: job["status"] == "running", timeout=120)
        cancelled = []
        for _ in range(cancels):
            job = service.submit(tiny_spec())
            cancelled.append(call(service, "POST", f"/v1/jobs/{job['id']}/cancel"))
            time.sleep(0.05)
        call(service, "POST", f"/v1/jobs/{blocker['id']}/cancel")
        service.wait(blocker["id"])
        finished = [service.wait(service.submit(tiny_spec(steps=1))["id"]) for _ in range(jobs)]
        total = cancels + 1 + jobs
        wait_for(lambda: len(receiver.delivered) >= total, 120, "every event")
    by_job = {a.payload["data"]["job_id"]: a for a in receiver.delivered.values()}
    assert receiver.rejected == 0, "a signature failed"
    assert len(receiver.delivered) == total, f"{len(receiver.delivered)} of {total} events"
    return {
        "API cancels": latency_summary([by_job[j["id"]].at - changed_at(j) for j in cancelled]),
        "worker ends": latency_summary([by_job[j["id"]].at - changed_at(j) for j in finished]),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cancels", type=int, default=100)
    parser.add_argument("--jobs", type=int, default=10)
    parser.add_argument("--poll-interval", type=float, default=1.0)
    args = parser.parse_args()
    try:
        figures = measure(args.cancels, args.jobs, args.poll_interval)
    except AssertionError as error:
        print(f"check failed: {error}", file=sys.stderr)
        return 1
    print(f"{'events':<14} {'p50 ms':>9} {'p99 ms':>9} {'max ms':>9}")
    for kind, summary in figures.items():
        print(
            f"{kind:<14} {summary['p50_ms']:>9.1f} {summary['p99_ms']:>9.1f} "
            f"{summary['max_ms']:>9.1f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
