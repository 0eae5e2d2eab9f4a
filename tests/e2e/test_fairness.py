"""Fair dispatch with real processes.

Jobs: two workers of two slots each on Postgres. Team A fills the queue with 40 jobs, then
team B (at most one running job) submits 2: B's first job starts at the next free slot, its
second at the next free slot after the first ends, B never runs two at once, and no job
starts twice or is lost (once B is done, A's jobs still queued are cancelled, to keep the
test short: each of them never started).

Sampling: team beta queues 48 prompts in three `/v1/completions` requests, then team alpha
one prompt; a worker with one sampling slot starts alpha's task after at most one of beta's
(the order read from the worker's log of the tasks it starts).

`pytest tests/e2e/test_fairness.py -s` prints the timelines (slots waited by B's jobs, the
sampling tasks of beta started before alpha's)."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

import httpx
import pytest
from redis import Redis
from sqlalchemy import create_engine, text

from app.core.db import sync_url
from app.core.worker_calls import quick_queue
from tests.e2e.conftest import E2E_REDIS_URL, Service, deployment, tiny_spec

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


BETA_REQUESTS = 3
BETA_PROMPTS = 16
STARTED = re.compile(r'→ \S+:sample\(\'\{"request":\{[^}]*?"text":"(\w+)')
"""arq's line for a sample task it starts: the prompt's first word names the team."""


def complete(service: Service, key: str, model: str, prompts: list[str]) -> httpx.Response:
    body = {"model": model, "prompt": prompts, "max_tokens": 2, "timeout_seconds": 300}
    return httpx.post(
        f"{service.url}/v1/completions",
        json=body,
        headers={"Authorization": f"Bearer {key}"},
        timeout=320,
    )


def queued_until(redis: Redis, queue: str, count: int, requests: list) -> None:
    deadline = time.monotonic() + 60
    while redis.zcard(queue) < count:
        assert not any(request.done() for request in requests), requests[0].result().text
        assert time.monotonic() < deadline, f"{redis.zcard(queue)} of {count} tasks queued"
        time.sleep(0.05)


def started_teams(log: Path) -> list[str]:
    return [match.group(1) for match in STARTED.finditer(log.read_text())]


def test_one_prompt_of_a_team_waits_behind_at_most_one_sampling_task_of_another(tmp_path):
    with deployment(tmp_path, f"sqlite:///{tmp_path / 'opd.db'}") as service:
        admin = service.opd("keys", "create", "--team", "ops", "--scope", "admin")
        service.key = admin.stdout.strip()
        keys = {
            team: service.opd("keys", "create", "--team", team).stdout.strip()
            for team in ("alpha", "beta")
        }
        trainer = service.start_worker()
        jobs = {team: post(service, key, SPEC | {"name": team}) for team, key in keys.items()}
        models = {team: f"job-{service.wait(job['id'])['id']}" for team, job in jobs.items()}
        trainer.terminate()
        trainer.wait(60)
        redis = Redis.from_url(E2E_REDIS_URL)
        queue = quick_queue(service.env["OPD_QUEUE_NAME"])
        with ThreadPoolExecutor(BETA_REQUESTS + 1) as pool:
            beta = [
                pool.submit(
                    complete,
                    service,
                    keys["beta"],
                    models["beta"],
                    [f"beta {r}.{i}" for i in range(BETA_PROMPTS)],
                )
                for r in range(BETA_REQUESTS)
            ]
            queued_until(redis, queue, BETA_REQUESTS * BETA_PROMPTS, beta)
            alpha = pool.submit(complete, service, keys["alpha"], models["alpha"], ["alpha"])
            queued_until(redis, queue, BETA_REQUESTS * BETA_PROMPTS + 1, [alpha])
            sampler = service.start_worker(OPD_SAMPLE_CONCURRENCY="1")
            answers = [request.result() for request in [alpha, *beta]]
        redis.close()

    assert all(answer.status_code == 200 for answer in answers), [a.text for a in answers]
    assert [len(answer.json()["choices"]) for answer in answers] == [1] + [BETA_PROMPTS] * 3
    order = started_teams(tmp_path / f"worker-{service.processes.index(sampler)}.log")
    assert sorted(order) == sorted(["alpha"] + ["beta"] * BETA_REQUESTS * BETA_PROMPTS), order
    before = order.index("alpha")
    print(f"\nbeta's sampling tasks started before alpha's one: {before} of {len(order) - 1}")
    assert before <= 1, order
