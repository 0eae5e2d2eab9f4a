"""A teacher on an inference server, end to end, with this service's own `/v1/completions` as
the server: real `opd api` and `opd worker` processes, the worker's job scoring over HTTP
through the API (which hands each request to a worker's playground, as any client's).

- equivalence: a job whose teacher is `server: {url: <service>/v1, model: job-N}` gives the
  reverse-KL curve of the same job with `teacher: {init_from: {job: N}}`;
- resume: kill -9 of the worker mid-job resumes against the server with the same curve;
- failures: a server that goes down is retried, then the job fails with a clear error and
  every step it finished kept once; a server the operator did not list is a 422.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest

from opd.serve import free_port
from tests.e2e.conftest import Service, deployment, tiny_spec
from tests.e2e.servers import Relay
from tests.e2e.test_faults import at_step, events, metric_rows
from tests.support import assert_close

KEY_ENV = "OPD_E2E_TEACHER_KEY"
CURVE = "opd/reverse_kl_mean"
STEPS, SAVE_EVERY = 12, 3


@pytest.fixture(scope="module")
def api_port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def relay(api_port: int) -> Iterator[Relay]:
    """A way to the API that a test can cut (a server going down)."""
    relay = Relay(api_port)
    yield relay
    relay.stop()


@pytest.fixture(scope="module")
def service(
    tmp_path_factory: pytest.TempPathFactory, api_port: int, relay: Relay
) -> Iterator[Service]:
    """One deployment whose teacher servers are its own API, directly or through `relay`."""
    home = tmp_path_factory.mktemp("teacher-server")
    allowed = [f"http://127.0.0.1:{api_port}/v1", f"{relay.url}/v1"]
    with deployment(
        home, f"sqlite:///{home / 'opd.db'}", port=api_port, teacher_servers=json.dumps(allowed)
    ) as running:
        running.start_worker(**{KEY_ENV: running.key})
        yield running


@pytest.fixture(scope="module")
def source(service: Service) -> int:
    """A finished tiny job: its final sampler weights are the teacher."""
    job = service.submit(tiny_spec(steps=4) | {"name": "teacher-source"})
    done = service.wait(job["id"])
    assert done["status"] == "succeeded", done
    return job["id"]


def spec_with(teacher: dict[str, Any], steps: int = STEPS) -> dict[str, Any]:
    return tiny_spec(steps=steps, save_every=SAVE_EVERY) | {"teacher": teacher}


def server_teacher(url: str, source: int, **options: Any) -> dict[str, Any]:
    server = {"url": f"{url}/v1", "model": f"job-{source}", "api_key_env": KEY_ENV}
    return {"server": server | options}


def curve(service: Service, job_id: int) -> list[float]:
    points = service.curve(job_id, CURVE)
    assert [step for step, _ in points] == list(range(len(points)))
    return [float(value) for _, value in points if value is not None]


@pytest.fixture(scope="module")
def loaded_run(service: Service, source: int) -> dict[str, Any]:
    local = {"base_model": "tiny-student", "init_from": {"job": source}}
    done = service.wait(service.submit(spec_with(local))["id"], timeout=600)
    assert done["status"] == "succeeded", done
    return done


@pytest.fixture(scope="module")
def served_run(service: Service, source: int) -> dict[str, Any]:
    job = service.submit(spec_with(server_teacher(service.url, source)))
    done = service.wait(job["id"], timeout=600)
    assert done["status"] == "succeeded", (done, service.logs())
    return done


def test_a_server_teacher_gives_the_curve_of_the_same_weights_loaded(
    service, loaded_run, served_run
):
    loaded, served = curve(service, loaded_run["id"]), curve(service, served_run["id"])
    assert len(loaded) == len(served) == STEPS
    difference = float(np.max(np.abs(np.subtract(served, loaded))))
    print(f"server teacher vs init_from teacher, {CURVE}: max abs difference {difference:.3g}")
    assert_close(served, loaded, rtol=1e-4, what="the reverse-KL curve")
    timeline = events(service, served_run["id"])
    assert f"server {service.url}/v1, same tokenizer, same chat template" in timeline
    # Each teacher's tokens are counted as the loaded teacher's are.
    assert served_run["usage"]["teacher_tokens"] == loaded_run["usage"]["teacher_tokens"] > 0


# SQLite, as test_faults' kill -9 test: the killed writer's lock is the next process's.
def test_kill_9_mid_job_resumes_against_the_server_with_the_same_curve(service, source, served_run):
    first = service.processes[-1]
    job = service.submit(spec_with(server_teacher(service.url, source)))
    service.wait(job["id"], at_step(SAVE_EVERY * 2), timeout=600)
    first.send_signal(signal.SIGKILL)
    first.wait()
    service.start_worker(**{KEY_ENV: service.key})
    done = service.wait(job["id"], timeout=600)

    assert done["status"] == "succeeded" and done["attempts"] == 2, done
    assert [step for step, _ in metric_rows(service, job["id"])] == list(range(STEPS))
    resumed, uninterrupted = curve(service, job["id"]), curve(service, served_run["id"])
    difference = float(np.max(np.abs(np.subtract(resumed, uninterrupted))))
    print(f"kill -9 and resume vs uninterrupted, {CURVE}: max abs difference {difference:.3g}")
    assert_close(resumed, uninterrupted, rtol=1e-6, what="the resumed curve")
    assert "Resumed from" in events(service, job["id"])


def test_a_server_that_goes_down_is_retried_then_fails_the_job_keeping_its_steps(
    service, source, relay
):
    relay.start()
    teacher = server_teacher(relay.url, source, max_retries=2, retry_delay_seconds=0.05)
    job = service.submit(spec_with(teacher, steps=200))
    service.wait(job["id"], at_step(2), timeout=600)
    relay.cut()
    done = service.wait(job["id"], timeout=600)

    assert done["status"] == "failed", done
    assert done["error"]["code"] == "teacher_server_unavailable", done["error"]
    message = done["error"]["message"]
    assert f"{relay.url}/v1" in message and "3 tries" in message and "max_retries" in message
    timeline = events(service, job["id"])
    assert f"Retrying teacher server {relay.url}/v1" in timeline
    steps = [step for step, _ in metric_rows(service, job["id"])]
    assert steps == list(range(done["steps_done"])) and len(steps) >= 2


def test_a_server_outside_the_operators_list_is_refused_at_submission(service, source):
    spec = spec_with(server_teacher("http://127.0.0.1:9", source))
    response = httpx.post(
        f"{service.url}/v1/jobs",
        json=spec,
        headers={"Authorization": f"Bearer {service.key}"},
        timeout=30,
    )
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["param"] == "teacher.server.url"
    assert "OPD_TEACHER_SERVERS" in error["message"] and service.url in error["message"]
