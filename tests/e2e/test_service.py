"""The whole service as users drive it: real API and worker processes, HTTP only."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest
import yaml

from tests.e2e.conftest import ROOT, Service, tiny_spec


def test_a_job_runs_and_its_curve_checkpoints_and_weights_are_served(service: Service):
    service.start_worker()
    job = service.submit(tiny_spec(save_every=20))
    assert job["status"] == "queued" and job["total_steps"] == 60

    done = service.wait(job["id"])

    assert done["status"] == "succeeded", done
    assert done["steps_done"] == 60 and done["attempts"] == 1
    curve = service.curve(job["id"], "opd/reverse_kl_mean")
    steps = [step for step, _ in curve]
    assert steps == list(range(60))  # every step exactly once
    values = np.array([value for _, value in curve])
    assert values[-5:].mean() <= 0.85 * values[:5].mean()

    checkpoints = list(service.client().jobs.checkpoints(job["id"]))
    kinds = [(c.step, c.kind) for c in checkpoints]
    assert kinds == [
        (20, "state"),
        (20, "sampler"),
        (40, "state"),
        (40, "sampler"),
        (60, "state"),
        (60, "final"),
    ]
    artifacts = service.home / "artifacts"  # a team's key names them from the job's folder on
    assert all(str(artifacts) not in c.path and (artifacts / c.path).is_dir() for c in checkpoints)
    assert done["final_weights_path"] == checkpoints[-1].path
    assert Path(artifacts, done["final_weights_path"], "adapter_model.safetensors").is_file()

    messages = " | ".join(event.message for event in service.events(job["id"]))
    assert "Loaded 8 prompts" in messages and "Succeeded" in messages


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_logit_level_objective_trains_through_the_service(service: Service):
    service.start_worker()
    objective = {"kind": "jsd", "top_k": 16}
    job = service.submit(tiny_spec(steps=24, objective=objective, save_weights_name="jsd"))

    done = service.wait(job["id"])

    assert done["status"] == "succeeded", done
    assert done["spec"]["loop"]["objective"] == {**objective, "beta": None, "tail": None}
    values = np.array([value for _, value in service.curve(job["id"], "opd/objective_mean")])
    assert len(values) == 24 and (values > 0).all()
    assert values[-4:].mean() < 0.8 * values[:4].mean(), values
    mass = [value for _, value in service.curve(job["id"], "opd/teacher_mass_mean")]
    assert len(mass) == 24 and all(0 < m <= 1 for m in mass)
    assert len(service.curve(job["id"], "opd/reverse_kl_mean")) == 24


# Cancels are stored alike on both databases (tests/app/jobs); end to end on SQLite, where
# the API's cancel and the worker's step writes take turns at one write lock.
@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_cancel_a_queued_and_a_running_job(service: Service):
    running = service.submit(tiny_spec(steps=2000))
    queued = service.submit(tiny_spec())
    service.start_worker()  # one job at a time: the second waits in the queue
    service.wait(running["id"], lambda job: job["steps_done"] >= 2)

    assert service.client().jobs.cancel(queued["id"]).status == "cancelled"

    assert service.client().jobs.cancel(running["id"]).status == "cancelling"
    done = service.wait(running["id"])
    assert done["status"] == "cancelled"
    assert done["steps_done"] < 2000
    assert done["last_state_step"] == done["steps_done"]  # stopped at a step boundary
    assert Path(service.home, "artifacts", done["last_state_path"]).is_dir()
    assert service.client().jobs.get(queued["id"]).attempts == 0  # never ran


# Refused before anything is stored: the database plays no part.
@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_bad_field_is_a_422_that_names_it(service: Service):
    spec = tiny_spec(steps=0)
    response = httpx.post(
        f"{service.url}/v1/jobs", json=spec, headers={"Authorization": f"Bearer {service.key}"}
    )
    assert response.status_code == 422
    error = response.json()["error"]
    assert error["param"] == "loop.steps" and "loop.steps" in error["message"]


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)  # where it was found
def test_what_a_spec_may_contain_is_checked_by_the_running_api(service: Service):
    """Found against `opd api` on Postgres: `{}` was a 201 (the reference's trio job), a
    misspelt preset failed only in the worker, and a sweep's Infinity dropped the
    connection. Each is now a 422 naming the field, and nothing is stored."""
    headers = {"Authorization": f"Bearer {service.key}", "Content-Type": "application/json"}
    sweep = {
        "name": "inf",
        "base": tiny_spec(),
        "parameters": {"optim.grad_clip_norm": {"values": [1.0, float("inf")]}},
        "method": "grid",
        "metric": {"name": "opd/reverse_kl_mean", "goal": "minimize"},
    }
    misspelt = tiny_spec() | {"teacher": {"base_model": "tiny-teachr"}}
    for path, body, param, says in (
        ("/v1/jobs", {}, "backend", "student: this field is required"),
        ("/v1/jobs", misspelt, "teacher.base_model", "did you mean tiny-teacher?"),
        ("/v1/sweeps", sweep, "parameters.optim.grad_clip_norm.values.1", "not JSON numbers"),
    ):
        response = httpx.post(f"{service.url}{path}", content=json.dumps(body), headers=headers)
        assert response.status_code == 422, response.text
        error = response.json()["error"]
        assert error["param"] == param and says in error["message"], error
    for listing in ("/v1/jobs", "/v1/sweeps"):
        assert httpx.get(f"{service.url}{listing}", headers=headers).json()["data"] == []


def short_demo(tmp_path: Path) -> tuple[Path, dict[str, str], str]:
    """The demo's spec cut to 2 steps with an eval at each, the environment of an
    `opd serve` of its own under `tmp_path`, and a port for it."""
    spec = yaml.safe_load((ROOT / "examples" / "arith.yaml").read_text())
    spec["loop"]["steps"] = 2
    spec["eval"] |= {"every": 1, "holdout": 8}
    short = tmp_path / "demo.yaml"
    short.write_text(yaml.safe_dump(spec))
    env = os.environ | {"OPD_HOME": str(tmp_path), "PYTHONPATH": str(ROOT)}
    env.pop("OPD_REDIS_URL", None)
    env.pop("OPD_DATABASE_URL", None)
    return short, env, str(20000 + os.getpid() % 20000)


def test_opd_serve_demo_runs_the_demo_job_to_success(tmp_path: Path):
    """The demo's spec, shortened to a few steps (the learning itself is tested by
    tests/worker/engine/loop/test_arith_learning.py): the job succeeds and the accuracy shows."""
    short, env, port = short_demo(tmp_path)
    command = [sys.executable, "-m", "opd.cli", "serve", "--demo", "--demo-spec", str(short)]
    done = subprocess.run(
        [*command, "--port", port],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )

    assert done.returncode == 0, done.stdout + done.stderr
    assert "Demo job 1: succeeded" in done.stdout
    measured = [line for line in done.stdout.splitlines() if "held-out accuracy at step" in line]
    assert [line.split()[4] for line in measured] == ["0:", "1:", "2:"], done.stdout
    assert done.stdout.index(measured[-1]) < done.stdout.index("Demo job 1: succeeded")
    assert "The demo is over and the service has stopped" in done.stdout
    assert "Start it again with `opd serve`" in done.stdout
    assert f"Dashboard: http://127.0.0.1:{port}/ui/" in done.stdout
    assert re.search(r"^One worker runs [234] jobs at once", done.stdout, re.M), done.stdout
    assert "held-out accuracy by step: 0: " in done.stdout
    assert re.search(
        r"^held-out accuracy: student \d+% -> \d+% \(teacher \d+%\) in \d+ s$", done.stdout, re.M
    ), done.stdout
    assert (tmp_path / "opd.db").is_file() and (tmp_path / "api-key").is_file()
    assert Path(tmp_path, "artifacts", "job-1", "sampler", "arith-opd").is_dir()


def test_the_demo_can_leave_the_service_running_and_says_how_to_stop_it(tmp_path: Path):
    short, env, port = short_demo(tmp_path)
    command = [sys.executable, "-m", "opd.cli", "serve", "--demo", "--demo-spec", str(short)]
    process = subprocess.Popen(
        [*command, "--keep-serving", "--port", str(int(port) + 1)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert process.stdout is not None
        lines = []
        for line in process.stdout:
            lines.append(line)
            if line.startswith("The service is running"):
                break
        assert "press Ctrl-C to stop it" in lines[-1], "".join(lines)
        ready = httpx.get(f"http://127.0.0.1:{int(port) + 1}/readyz", timeout=10)
        assert ready.status_code == 200
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=120) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
