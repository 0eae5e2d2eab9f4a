"""Faults injected for real: kill -9, SIGTERM, pause/resume, Redis and Postgres stopped and
started. After each, the job's metric table must hold every step exactly once and equal
an uninterrupted run's (tiny presets, fixed seeds)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from sqlalchemy import create_engine, text

from app.core.db import sync_url
from tests.e2e.conftest import ROOT, Service, deployment, tiny_spec
from tests.e2e.servers import PostgresServer, RedisServer, Relay

SPEC = tiny_spec(steps=20, save_every=5)
OFF_POLICY_SPEC = tiny_spec(steps=20, save_every=5, max_steps_off_policy=1)
COMPARED = ("opd/reverse_kl_mean", "trainer/loss_sum", "data/completion_tokens_total")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[int, dict[str, float]]:
    """SPEC run once in the foreground with `opd run`: what every faulted run must equal."""
    return foreground_run(tmp_path_factory, SPEC)


def foreground_run(
    tmp_path_factory: pytest.TempPathFactory, spec: dict[str, Any]
) -> dict[int, dict[str, float]]:
    folder = tmp_path_factory.mktemp("reference")
    (folder / "spec.yaml").write_text(yaml.safe_dump(spec))
    subprocess.run(
        [sys.executable, "-m", "opd.cli", "run", "spec.yaml", "--metrics-out", "m.jsonl"],
        cwd=folder,
        check=True,
        capture_output=True,
        timeout=300,
        env=os.environ | {"PYTHONPATH": str(ROOT)},
    )
    rows = [json.loads(line) for line in (folder / "m.jsonl").read_text().splitlines()]
    return {row["step"]: row for row in rows}


def metric_rows(service: Service, job_id: int) -> list[tuple[int, dict[str, Any]]]:
    """The job's rows straight from the database: duplicates would show here."""
    engine = create_engine(sync_url(service.env["OPD_DATABASE_URL"]))
    with engine.connect() as connection:
        rows = connection.execute(
            text("SELECT step, metrics FROM step_metrics WHERE job_id = :id ORDER BY step"),
            {"id": job_id},
        ).all()
    engine.dispose()
    return [(step, m if isinstance(m, dict) else json.loads(m)) for step, m in rows]


def assert_same_as_uninterrupted(service: Service, job_id: int, expected: dict) -> None:
    rows = metric_rows(service, job_id)
    assert [step for step, _ in rows] == list(range(SPEC["loop"]["steps"]))
    for step, metrics in rows:
        for key in COMPARED:
            assert metrics[key] == expected[step][key], (step, key)


def events(service: Service, job_id: int) -> str:
    return " | ".join(event.message for event in service.events(job_id))


def at_step(n: int):
    return lambda job: job["steps_done"] >= n


# SQLite, where a writer killed -9 leaves its lock and journal to the next process; on
# Postgres, kill -9 is in the off-policy test below and in the chaos soak.
@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_kill_9_mid_job_resumes_from_the_last_state_on_a_live_worker(service, uninterrupted):
    first = service.start_worker()
    job = service.submit(SPEC)
    service.wait(job["id"], at_step(12))
    first.send_signal(signal.SIGKILL)
    killed_at = time.monotonic()
    first.wait()

    service.start_worker()
    resumed = service.wait(job["id"], lambda j: j["attempts"] == 2 and j["status"] == "running")
    assert resumed["last_state_step"] >= 10
    done = service.wait(job["id"])
    print(f"kill -9 -> running again on a live worker: {time.monotonic() - killed_at:.1f}s")

    assert done["status"] == "succeeded" and done["attempts"] == 2
    assert_same_as_uninterrupted(service, job["id"], uninterrupted)
    timeline = events(service, job["id"])
    assert "stopped sending heartbeats" in timeline and "Resumed from" in timeline
    for name in ("sampled_tokens", "teacher_tokens", "trained_tokens"):  # replays count once
        assert done["usage"][name] == sum(row[f"usage/{name}"] for row in uninterrupted.values())


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
def test_sigterm_stops_at_a_step_boundary_and_another_worker_continues(service, uninterrupted):
    first = service.start_worker()
    job = service.submit(SPEC)
    service.wait(job["id"], at_step(8))
    first.send_signal(signal.SIGTERM)
    assert first.wait(60) == 0

    requeued = service.client().jobs.get(job["id"])
    assert requeued.status == "queued"
    assert requeued.last_state_step == requeued.steps_done  # saved at the boundary
    service.start_worker()
    done = service.wait(job["id"])

    assert done["status"] == "succeeded" and done["attempts"] == 2
    assert_same_as_uninterrupted(service, job["id"], uninterrupted)
    assert "Requeued: the worker is shutting down" in events(service, job["id"])


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
def test_pause_keeps_the_state_and_resume_continues_exactly(service, uninterrupted):
    service.start_worker()
    client = service.client()
    job = service.submit(SPEC)
    service.wait(job["id"], at_step(6))

    assert client.jobs.pause(job["id"]).status == "pausing"
    assert client.jobs.pause(job["id"]).status in ("pausing", "paused")  # idempotent
    paused = service.wait(job["id"], lambda j: j["status"] == "paused")
    assert Path(service.home, "artifacts", paused["last_state_path"]).is_dir()
    time.sleep(1)
    assert client.jobs.get(job["id"]).status == "paused"  # nothing picks it up meanwhile

    assert client.jobs.resume(job["id"]).status == "queued"
    done = service.wait(job["id"])
    assert done["status"] == "succeeded"
    assert_same_as_uninterrupted(service, job["id"], uninterrupted)

    conflict = httpx.post(
        f"{service.url}/v1/jobs/{job['id']}/pause",
        headers={"Authorization": f"Bearer {service.key}"},
    )
    assert conflict.status_code == 409
    assert "succeeded" in conflict.json()["error"]["message"]


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
def test_one_step_off_policy_resumes_exactly_after_pause_and_kill_9(service, tmp_path_factory):
    """max_steps_off_policy: 1 samples each step from the weights one step back: after a
    pause and after kill -9 the resumed job samples from the saved weights and repeats an
    uninterrupted run's steps."""
    expected = foreground_run(tmp_path_factory, OFF_POLICY_SPEC)
    first = service.start_worker()
    client = service.client()
    job = service.submit(OFF_POLICY_SPEC)
    service.wait(job["id"], at_step(3))

    client.jobs.pause(job["id"])
    paused = service.wait(job["id"], lambda j: j["status"] == "paused")
    assert paused["last_state_step"] == paused["steps_done"]
    client.jobs.resume(job["id"])
    service.wait(job["id"], at_step(paused["steps_done"] + 8))  # past a scheduled save
    first.send_signal(signal.SIGKILL)
    first.wait()
    service.start_worker()
    done = service.wait(job["id"])

    assert done["status"] == "succeeded" and done["attempts"] == 3
    assert_same_as_uninterrupted(service, job["id"], expected)
    assert events(service, job["id"]).count("Resumed from") == 2


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    server = RedisServer()
    server.start()
    yield server
    server.remove()


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
def test_redis_outage_loses_no_job(tmp_path, database_url, own_redis, uninterrupted):
    with deployment(tmp_path, database_url, own_redis.url) as service:
        worker = service.start_worker()
        running = service.submit(SPEC)
        service.wait(running["id"], at_step(3))

        own_redis.stop()
        waiting = service.submit(SPEC)  # accepted while Redis is down
        assert waiting["status"] == "queued" and "Redis" in waiting["queue_reason"]
        before = service.client().jobs.get(running["id"]).steps_done
        service.wait(running["id"], at_step(before + 3))  # training goes on meanwhile
        time.sleep(3)
        own_redis.start()  # empty: every message it held is gone

        for job in (running, waiting):
            assert service.wait(job["id"])["status"] == "succeeded"
            assert_same_as_uninterrupted(service, job["id"], uninterrupted)
        assert worker.poll() is None  # the worker lived through the outage


@pytest.fixture
def own_postgres() -> Iterator[PostgresServer]:
    server = PostgresServer()
    server.start()
    yield server
    server.remove()


def test_database_outage_mid_job_loses_no_step(tmp_path, own_postgres, uninterrupted):
    # A heartbeat timeout longer than the outage: the same worker must ride it out.
    with deployment(tmp_path, own_postgres.url, heartbeat_timeout="60") as service:
        worker = service.start_worker()
        job = service.submit(SPEC)
        service.wait(job["id"], at_step(5))

        own_postgres.stop()
        time.sleep(6)
        own_postgres.start()

        done = service.wait(job["id"])
        assert done["status"] == "succeeded" and done["attempts"] == 1
        assert_same_as_uninterrupted(service, job["id"], uninterrupted)
        assert worker.poll() is None
        log = "".join(p.read_text() for p in tmp_path.glob("worker-*.log"))
        assert "database write failed" in log  # the outage was really felt


def test_a_database_outage_longer_than_the_heartbeat_timeout_takes_no_job_over(
    tmp_path, own_postgres
):
    """Postgres restarts after an outage longer than the heartbeat timeout, and the worker
    that runs the job reaches it again 3 s after the other (a slow reconnect, as under
    load): the idle worker, though it sees stale heartbeats first, must not take the job
    over: it counts no heartbeat missing until it has seen the database for a whole
    timeout (worker/service/sight.py). One attempt, every step recorded once."""
    timeout = 6.0
    spec = tiny_spec(steps=30, save_every=5)
    relays = [Relay(own_postgres.port), Relay(own_postgres.port)]
    with deployment(tmp_path, own_postgres.url, heartbeat_timeout=str(timeout)) as service:
        workers = {}
        for relay in relays:
            relay.start()
            url = f"postgresql://postgres@127.0.0.1:{relay.port}/postgres"
            workers[service.start_worker(OPD_DATABASE_URL=url).pid] = relay
        deadline = time.monotonic() + 120
        while len(list(tmp_path.glob("worker-*.log"))) < 2 or not all(
            "serving queue" in log.read_text() for log in tmp_path.glob("worker-*.log")
        ):
            assert time.monotonic() < deadline, "the workers did not start"
            time.sleep(0.2)
        time.sleep(timeout + 1)  # both have seen the database for a heartbeat timeout
        job = service.submit(spec)
        running = service.wait(job["id"], at_step(3))
        runner = workers[int(running["worker_id"].rsplit(":", 1)[1])]
        (idle,) = (relay for relay in relays if relay is not runner)

        for relay in relays:
            relay.cut()
        own_postgres.stop()
        time.sleep(timeout + 2)
        own_postgres.start()
        idle.start()
        time.sleep(3)
        runner.start()

        done = service.wait(job["id"])
        assert done["status"] == "succeeded", done
        assert done["attempts"] == 1, events(service, job["id"])
        assert "took over" not in events(service, job["id"])
        steps = [step for step, _ in metric_rows(service, job["id"])]
        assert steps == list(range(spec["loop"]["steps"]))
        log = "".join(p.read_text() for p in tmp_path.glob("worker-*.log"))
        assert "heartbeat failed" in log  # the outage was really felt
