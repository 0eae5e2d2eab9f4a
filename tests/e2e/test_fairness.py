"""Fair dispatch with real processes: two workers of two slots each on Postgres. Team A fills
the queue with 40 jobs, then team B (at most one running job) submits 2: B's first job
starts at the next free slot, its second at the next free slot after the first ends, B
never runs two at once, and no job starts twice or is lost (once B is done, A's jobs still
queued are cancelled, to keep the test short: each of them never started).

`pytest tests/e2e/test_fairness.py -s` prints the timeline (slots waited by B's jobs)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime

import httpx
import pytest
from sqlalchemy import create_engine, text

from app.core.db import sync_url
from tests.e2e.conftest import Service, tiny_spec

SLOTS = 4
A_JOBS = 40
SPEC = tiny_spec(steps=2, batch_size=1, group_size=2) | {"sampling": {"max_tokens": 8}}


def post(service: Service, key: str, spec: dict) -> dict:
    response = httpx.post(
        f"{service.url}/v1/jobs", json=spec, headers={"Authorization": f"Bearer {key}"}, timeout=30
    )
    assert response.status_code == 201, response.text
    return response.json()


@contextmanager
def running_counts(service: Service) -> Iterator[list[dict[str, int]]]:
    """Samples of the jobs each team runs, read from the database every 20 ms meanwhile."""
    engine = create_engine(sync_url(service.env["OPD_DATABASE_URL"]))
    samples: list[dict[str, int]] = []
    done = threading.Event()

    def sample() -> None:
        with engine.connect() as connection:
            while not done.is_set():
                rows = connection.execute(
                    text(
                        "SELECT teams.name, count(*) FROM jobs JOIN teams"
                        " ON teams.id = jobs.team_id WHERE status IN"
                        " ('running', 'cancelling', 'pausing') GROUP BY teams.name"
                    )
                )
                samples.append(dict(rows.all()))
                connection.commit()
                time.sleep(0.02)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield samples
    finally:
        done.set()
        thread.join()
        engine.dispose()


def at(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def starts_between(jobs: list[dict], after: str, before: str) -> int:
    """Jobs that started after `after` and before `before`: the slots given to others."""
    return sum(1 for job in jobs if at(after) < at(job["started_at"]) < at(before))


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
def test_a_small_team_gets_the_next_free_slot_and_limits_hold(service: Service):
    service.key = service.opd("keys", "create", "--team", "ops", "--scope", "admin").stdout.strip()
    key_a = service.opd("keys", "create", "--team", "a").stdout.strip()
    key_b = service.opd("keys", "create", "--team", "b").stdout.strip()
    service.opd("teams", "set", "b", "--max-running", "1")
    a_jobs = [post(service, key_a, SPEC) for _ in range(A_JOBS)]
    with running_counts(service) as samples:
        for _ in range(2):
            service.start_worker(OPD_WORKER_CONCURRENCY="2")
        busy = time.monotonic() + 120
        client = service.client()
        while len(list(client.jobs.list(status="running"))) < SLOTS:  # every slot: A's jobs
            assert time.monotonic() < busy, service.logs()
            time.sleep(0.1)
        queued = list(client.jobs.list(status="queued"))
        b_jobs = [post(service, key_b, SPEC) for _ in range(2)]
        b_first, b_second = (service.wait(job["id"], timeout=300) for job in b_jobs)
        cut = max(b_first["finished_at"], b_second["finished_at"])
        for job in a_jobs:  # enough: the rest never start (or stop at a step boundary)
            cancel = f"{service.url}/v1/jobs/{job['id']}/cancel"
            answer = httpx.post(cancel, headers={"Authorization": f"Bearer {service.key}"})
            assert answer.status_code in (200, 409), answer.text  # 409: it already ended
        done = [service.wait(job["id"], timeout=300) for job in a_jobs] + [b_first, b_second]

    assert len(queued) >= A_JOBS - SLOTS, "B arrived behind a full queue"
    assert {job["status"] for job in done} <= {"succeeded", "cancelled"}
    ran = [job for job in done if job["attempts"] == 1]
    never_started = [job for job in done if job["attempts"] == 0]
    assert len(ran) + len(never_started) == A_JOBS + 2, "no job started twice"
    assert all(job["status"] == "succeeded" for job in ran if job["finished_at"] < cut)
    assert all(job["status"] == "cancelled" and not job["started_at"] for job in never_started)
    assert b_first["status"] == b_second["status"] == "succeeded"
    waited_first = starts_between(ran, b_first["created_at"], b_first["started_at"])
    waited_second = starts_between(ran, b_first["finished_at"], b_second["started_at"])
    print(
        f"\nB's first job waited {waited_first} slot(s) after it was submitted; its second "
        f"waited {waited_second} slot(s) after the first ended (limit 1 running); "
        f"A jobs still queued when B submitted: {len(queued)}"
    )
    assert waited_first <= SLOTS and waited_second <= SLOTS
    b_running = [sample.get("b", 0) for sample in samples]
    assert max(b_running) == 1, "B ran, and never two at once"
    assert max(sum(sample.values()) for sample in samples) <= SLOTS
    starts = [
        event.message
        for job in done
        for event in service.events(job["id"])
        if event.message.startswith("Attempt")
    ]
    assert len(starts) == len(ran), "every job that ran started once"

    client_args = ("--url", service.url, "--key", key_b)
    usage = service.opd("usage", *client_args)
    rows = [line.split() for line in usage.stdout.splitlines() if line.startswith("b ")]
    assert sorted(int(row[1]) for row in rows) == [b_first["id"], b_second["id"]]
    assert all(int(row[4].replace(",", "")) > 0 for row in rows), "sampled tokens counted"
    assert "No price table" in usage.stderr
    audit = service.opd("audit", *client_args).stdout
    assert audit.count("job.create") == 2 and f"job {b_first['id']}" in audit
