"""A teacher on an inference server, end to end, with this service's own `/v1/completions` as
the server: real `opd api` and `opd worker` processes, the worker's job scoring over HTTP
through the API (which hands each request to a worker's playground, as any client's).

- equivalence: a job whose teacher is `server: {url: <service>/v1, model: job-N}` gives the
  reverse-KL curve of the same job with `teacher: {init_from: {job: N}}`, in each of
  several pairs run at once;
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

CURVE = "opd/reverse_kl_mean"
STEPS, SAVE_EVERY = 12, 3
SAMPLES = 16
"""Every rollout of a tiny step (batch 4 x group 4) is kept, to compare them."""


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
    # The operator binds the service's own /v1 (directly or through the relay) to `self`:
    # the worker calls it with short-lived tokens of each job's team, holding no key.
    allowed = {f"http://127.0.0.1:{api_port}/v1": "self", f"{relay.url}/v1": "self"}
    # One scoring at a time: the server's answers do not depend on what shares a batch.
    with deployment(
        home,
        f"sqlite:///{home / 'opd.db'}",
        port=api_port,
        teacher_servers=json.dumps(allowed),
        sample_concurrency="1",
        worker_concurrency="2",
    ) as running:
        running.start_worker()
        yield running


@pytest.fixture(scope="module")
def source(service: Service) -> int:
    """A finished tiny job: its final sampler weights are the teacher."""
    job = service.submit(tiny_spec(steps=4) | {"name": "teacher-source"})
    done = service.wait(job["id"])
    assert done["status"] == "succeeded", done
    return job["id"]


def spec_with(teacher: dict[str, Any], steps: int = STEPS) -> dict[str, Any]:
    spec = tiny_spec(steps=steps, save_every=SAVE_EVERY, keep_samples=SAMPLES)
    return spec | {"teacher": teacher}


def server_teacher(url: str, source: int, **options: Any) -> dict[str, Any]:
    server = {"url": f"{url}/v1", "model": f"job-{source}"}
    return {"server": server | options}


def curve(service: Service, job_id: int) -> list[float]:
    points = service.curve(job_id, CURVE)
    assert [step for step, _ in points] == list(range(len(points)))
    return [float(value) for _, value in points if value is not None]


REPEATS = 3
"""Pairs of jobs (server teacher, the same weights loaded) run at once, two jobs at a time
on the worker: the worker's playground loads `job-N` while other jobs load their models
(an adapter read on one thread gave a preset built on another other weights)."""


@pytest.fixture(scope="module")
def runs(service: Service, source: int) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """REPEATS pairs of finished jobs (the teacher loaded by init_from, then served)."""
    local = {"base_model": "tiny-student", "init_from": {"job": source}}
    submitted = [
        (
            service.submit(spec_with(local)),
            service.submit(spec_with(server_teacher(service.url, source))),
        )
        for _ in range(REPEATS)
    ]
    pairs = []
    for loaded, served in submitted:
        done = (service.wait(loaded["id"], timeout=600), service.wait(served["id"], timeout=600))
        assert all(job["status"] == "succeeded" for job in done), (done, service.logs())
        pairs.append(done)
    return pairs


@pytest.fixture(scope="module")
def served_run(runs: list[tuple[dict[str, Any], dict[str, Any]]]) -> dict[str, Any]:
    return runs[0][1]


def kept(service: Service, job_id: int) -> dict[int, list[Any]]:
    """The job's kept rollouts (all of each step's), by step, in their order."""
    by_step: dict[int, list[Any]] = {}
    with service.client() as client:
        for sample in client.jobs.samples(job_id):
            by_step.setdefault(sample.step, []).append(sample)
    return by_step


def token_kls(by_step: dict[int, list[Any]], steps: list[int]) -> np.ndarray:
    """Every kept token's reverse KL on `steps`, in order."""
    return np.array([v for step in steps for s in by_step[step] for v in s.reverse_kl], float)


def test_a_server_teacher_gives_the_curve_of_the_same_weights_loaded(service, runs):
    """Each pair samples the same completions from the same student until float rounding
    (the two teachers' forward passes are batched differently) flips a sampled token; on
    every step before that, each token's reverse KL and the step's curve agree within
    float tolerance, and so do the teacher tokens counted."""
    for loaded, served in runs:
        same_curves(service, loaded["id"], served["id"])
    timeline = events(service, runs[0][1]["id"])
    assert f"server {service.url}/v1, same tokenizer, same chat template" in timeline


def same_curves(service: Service, loaded_id: int, served_id: int) -> None:
    loaded, served = curve(service, loaded_id), curve(service, served_id)
    assert len(loaded) == len(served) == STEPS
    ours, theirs = kept(service, served_id), kept(service, loaded_id)
    alike = []
    for step in range(STEPS):
        sampled = [(s.prompt, s.tokens) for s in ours[step]]
        if sampled != [(s.prompt, s.tokens) for s in theirs[step]]:
            break
        assert len(sampled) == SAMPLES
        alike.append(step)
    assert alike, "step 0 samples from the same weights with the same seed"
    served_kl, loaded_kl = token_kls(ours, alike), token_kls(theirs, alike)
    what = f"jobs {served_id} (served) and {loaded_id} (loaded):"
    assert_close(served_kl, loaded_kl, rtol=1e-4, what=f"{what} each token's reverse KL")
    assert_close(served[: len(alike)], loaded[: len(alike)], rtol=1e-4, what=f"{what} the curve")
    ours_rows, theirs_rows = (
        dict(metric_rows(service, served_id)),
        dict(metric_rows(service, loaded_id)),
    )
    for step in alike:  # each teacher's tokens are counted as the loaded teacher's are
        tokens = "usage/teacher_tokens"
        assert ours_rows[step][tokens] == theirs_rows[step][tokens] > 0
    print(
        f"{what} the same samples on steps 0..{alike[-1]} of {STEPS}; there, max abs "
        f"difference of {CURVE} "
        f"{np.max(np.abs(np.subtract(served[: len(alike)], loaded[: len(alike)]))):.3g}, of "
        f"each token's reverse KL {np.max(np.abs(served_kl - loaded_kl)):.3g} "
        f"({served_kl.size} tokens); over all {STEPS} steps, of {CURVE} "
        f"{np.max(np.abs(np.subtract(served, loaded))):.3g}"
    )


# SQLite, as test_faults' kill -9 test: the killed writer's lock is the next process's.
def test_kill_9_mid_job_resumes_against_the_server_with_the_same_curve(service, source, served_run):
    first = service.processes[-1]
    job = service.submit(spec_with(server_teacher(service.url, source)))
    service.wait(job["id"], at_step(SAVE_EVERY * 2), timeout=600)
    first.send_signal(signal.SIGKILL)
    first.wait()
    service.start_worker()
    done = service.wait(job["id"], timeout=600)

    assert done["status"] == "succeeded" and done["attempts"] == 2, done
    assert [step for step, _ in metric_rows(service, job["id"])] == list(range(STEPS))
    resumed, uninterrupted = curve(service, job["id"]), curve(service, served_run["id"])
    difference = float(np.max(np.abs(np.subtract(resumed, uninterrupted))))
    print(f"kill -9 and resume vs uninterrupted, {CURVE}: max abs difference {difference:.3g}")
    assert resumed == uninterrupted
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
