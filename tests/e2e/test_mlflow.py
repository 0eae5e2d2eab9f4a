"""MLflow mirroring against a real `mlflow server`: a job's run holds exactly the job's
metrics (each step once, after a kill -9 resume too, and after a crash before the run's id
was kept), its spec as params and as an artifact (the final weights too, when asked), its
checkpoints as tags and its final status, also when no
worker ends the job (cancelled while paused, or by a dead worker's successor); a tracker
that is down holds no job up, and the mirror catches up once it is back; `opd run
--resume` goes on with the same run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from mlflow.tracking import MlflowClient
from sqlalchemy import create_engine, text

from app.core.db import sync_url
from tests.e2e.conftest import ROOT, TINY, Service, deployment, tiny_spec
from tests.e2e.servers import MlflowServer, Relay
from tests.e2e.test_faults import at_step, metric_rows
from worker.engine.tracking.mlflow_mirror import mlflow_key


@pytest.fixture(scope="module")
def mlflow_server() -> Iterator[MlflowServer]:
    server = MlflowServer()
    server.start()
    yield server
    server.remove()


@pytest.fixture(scope="module")
def relay(mlflow_server: MlflowServer) -> Iterator[Relay]:
    """A way to the server that is down until a test starts it."""
    relay = Relay(mlflow_server.port)
    yield relay
    relay.stop()


@pytest.fixture(scope="module")
def service(
    tmp_path_factory: pytest.TempPathFactory, mlflow_server: MlflowServer, relay: Relay
) -> Iterator[Service]:
    """One deployment for the module's jobs, allowed to mirror to the server and the relay."""
    home = tmp_path_factory.mktemp("service")
    with deployment(
        home,
        f"sqlite:///{home / 'opd.db'}",
        mlflow_tracking_uris=json.dumps([mlflow_server.url, relay.url]),
    ) as running:
        yield running


def mirrored_spec(uri: str, experiment: str, *, evals: bool = False, **loop: Any) -> dict[str, Any]:
    spec = tiny_spec(**loop)
    if evals:
        spec["eval"] = yaml.safe_load(TINY.read_text())["eval"] | {"every": 4}
    spec["trackers"] = {"mlflow": {"tracking_uri": uri, "experiment": experiment}}
    return spec


def eventually(check: Callable[[], Any], what: str, timeout: float = 90) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.5)
    return found


def finished_run(client: MlflowClient, run_id: str) -> Any:
    """The run once the mirror sent its final status (it sends after the job has ended)."""
    return eventually(
        lambda: (run := client.get_run(run_id)).info.status != "RUNNING" and run,
        f"run {run_id} ended",
    )


def assert_history_is(client: MlflowClient, run_id: str, steps: dict[int, dict[str, float]]):
    """Every metric's MLflow history is exactly ours: the same steps, each once, same values."""
    ours: dict[str, list[tuple[int, float]]] = {}
    for step, metrics in sorted(steps.items()):
        for name, value in metrics.items():
            ours.setdefault(mlflow_key(name), []).append((step, value))
    assert set(client.get_run(run_id).data.metrics) == set(ours)
    for key, points in ours.items():
        history = client.get_metric_history(run_id, key)
        assert sorted((m.step, m.value) for m in history) == points, key


def only_worker(service: Service) -> subprocess.Popen:
    """A new worker, the deployment's only live one (an earlier test's is killed), so a
    test knows which process runs its job."""
    for process in service.processes[1:]:  # the first is the API
        if process.poll() is None:
            process.kill()
            process.wait()
    return service.start_worker()


def through_kill_9(
    service: Service,
    spec: dict[str, Any],
    at: int,
    ready: Callable[[int], bool] = lambda job_id: True,
) -> dict[str, Any]:
    """Run `spec`, kill -9 its worker after `at` steps and once `ready(job id)`, let another
    finish it: the job."""
    first = only_worker(service)
    job = service.submit(spec)
    service.wait(job["id"], lambda j: at_step(at)(j) and ready(j["id"]))
    first.send_signal(signal.SIGKILL)
    first.wait()
    service.start_worker()
    done = service.wait(job["id"])
    assert done["status"] == "succeeded" and done["attempts"] == 2
    return done


def timeline(service: Service, job_id: int) -> list[str]:
    return [event.message for event in service.events(job_id)]


def test_a_job_resumed_after_kill_9_is_one_run_holding_exactly_its_metrics(
    service, mlflow_server, tmp_path
):
    spec = mirrored_spec(mlflow_server.url, "kill-9", evals=True, steps=12, save_every=4)
    spec["trackers"]["mlflow"]["log_final_weights"] = True
    done = through_kill_9(service, spec, at=6)
    rows = dict(metric_rows(service, done["id"]))

    client = MlflowClient(mlflow_server.url)
    experiment = client.get_experiment_by_name("kill-9")
    runs = client.search_runs([experiment.experiment_id])
    assert [run.info.run_id for run in runs] == [done["mlflow_run_id"]]  # resumed, not a new one
    run = finished_run(client, done["mlflow_run_id"])
    assert run.info.status == "FINISHED" and run.info.run_name == "tiny-opd"
    assert sorted(rows) == list(range(13))  # 12 steps and the final eval
    assert_history_is(client, run.info.run_id, rows)
    params, tags = run.data.params, run.data.tags
    assert params["loop.steps"] == "12" and params["student.base_model"] == "tiny-student"
    assert params["trackers.mlflow.experiment"] == "kill-9" and params["dataset_size"] == "8"
    assert tags["opd.job_id"] == str(done["id"]) and tags["opd.backend"] == "local"
    assert tags["opd.checkpoint.final"] == done["final_weights_path"]  # as the team sees it
    assert {f"opd.checkpoint.state.{step}" for step in (4, 8, 12)} <= set(tags)
    assert all(tags[f"opd.checkpoint.state.{step}"].startswith("job-") for step in (4, 8, 12))
    assert "eval/accuracy" in rows[0] and "eval/accuracy" in rows[12]
    sent = yaml.safe_load(
        Path(client.download_artifacts(run.info.run_id, "opd/spec.yaml", str(tmp_path))).read_text()
    )
    assert sent == done["spec"]  # the spec itself, not only its flattened params
    weights = {a.path for a in client.list_artifacts(run.info.run_id, "final_weights")}
    assert "final_weights/adapter_model.safetensors" in weights


def test_a_tracker_that_is_down_holds_no_job_up_and_the_mirror_catches_up(
    service, mlflow_server, relay
):
    """A kill -9 meanwhile too: the steps it kept from the tracker come from the database.
    Each attempt's mirror tried before the tracker came up (a worker's first import of
    mlflow takes seconds, the tiny job's steps do not)."""

    def unreachable(job_id: int) -> int:
        return sum(m.startswith("MLflow unreachable") for m in timeline(service, job_id))

    spec = mirrored_spec(relay.url, "outage", steps=40, save_every=2)
    done = through_kill_9(service, spec, at=5, ready=lambda job_id: unreachable(job_id) == 1)
    assert done["mlflow_run_id"] is None  # never reached: the job ran to its end without it
    eventually(lambda: unreachable(done["id"]) == 2, "the second attempt's mirror tried")

    relay.start()  # the server is up from now on
    caught_up = eventually(
        lambda: (
            (events := timeline(service, done["id"]))[-1].startswith("MLflow caught up") and events
        ),
        "the mirror caught up",
        timeout=180,  # its retries back off; a loaded CI machine took over 90 s once
    )
    job = service.wait(done["id"], lambda j: j["mlflow_run_id"] is not None, timeout=90)
    rows = dict(metric_rows(service, job["id"]))

    mentions = [message for message in caught_up if message.startswith("MLflow")]
    kinds = [message.split(" ")[1] for message in mentions]
    assert kinds == ["unreachable", "unreachable", "caught"]  # once for each attempt
    client = MlflowClient(mlflow_server.url)
    run = finished_run(client, job["mlflow_run_id"])
    assert run.info.status == "FINISHED"
    assert_history_is(client, run.info.run_id, rows)


def forget_run(service: Service, job_id: int) -> None:
    """What a worker that died between making the job's run and keeping its id leaves: a
    run in MLflow, none on the job row."""
    engine = create_engine(sync_url(service.env["OPD_DATABASE_URL"]))
    with engine.begin() as connection:
        connection.execute(
            text("UPDATE jobs SET mlflow_run_id = NULL WHERE id = :id"), {"id": job_id}
        )
    engine.dispose()


def test_a_run_whose_id_was_never_kept_is_the_one_the_next_attempt_goes_on_with(
    service, mlflow_server
):
    first = only_worker(service)
    job = service.submit(mirrored_spec(mlflow_server.url, "unkept", steps=8, save_every=2))
    made = service.wait(job["id"], lambda j: j["mlflow_run_id"] is not None and at_step(3)(j))
    first.send_signal(signal.SIGKILL)
    first.wait()
    forget_run(service, job["id"])
    service.start_worker()
    done = service.wait(job["id"])
    rows = dict(metric_rows(service, done["id"]))

    assert done["status"] == "succeeded" and done["attempts"] == 2
    client = MlflowClient(mlflow_server.url)
    experiment = client.get_experiment_by_name("unkept")
    runs = client.search_runs([experiment.experiment_id])
    assert [run.info.run_id for run in runs] == [made["mlflow_run_id"]] == [done["mlflow_run_id"]]
    assert finished_run(client, done["mlflow_run_id"]).info.status == "FINISHED"
    assert_history_is(client, done["mlflow_run_id"], rows)


def running_run(service: Service, mlflow_server: MlflowServer, experiment: str) -> dict[str, Any]:
    """A mirrored job of many steps, on the deployment's only worker, once its run is open."""
    only_worker(service)
    job = service.submit(mirrored_spec(mlflow_server.url, experiment, steps=200, save_every=2))
    return service.wait(job["id"], lambda j: j["mlflow_run_id"] is not None and at_step(2)(j))


def test_a_job_cancelled_while_paused_ends_its_run_killed(service, mlflow_server):
    """No worker holds a paused job: the API's cancel ends its run, through a worker's ender."""
    job = running_run(service, mlflow_server, "paused")
    with service.client() as opd:
        opd.jobs.pause(job["id"])
        service.wait(job["id"], lambda j: j["status"] == "paused")
        client = MlflowClient(mlflow_server.url)
        assert client.get_run(job["mlflow_run_id"]).info.status == "RUNNING"  # it may resume
        opd.jobs.cancel(job["id"])

    assert service.wait(job["id"])["status"] == "cancelled"
    assert finished_run(client, job["mlflow_run_id"]).info.status == "KILLED"


def test_a_cancel_a_dead_workers_successor_carries_out_ends_its_run_killed(service, mlflow_server):
    """The worker dies, the job is cancelled meanwhile, and the worker that claims it ends
    it at once (it runs nothing, so no mirror of its own ends the run)."""
    job = running_run(service, mlflow_server, "orphaned")
    [worker] = [p for p in service.processes[1:] if p.poll() is None]
    worker.send_signal(signal.SIGKILL)
    worker.wait()
    with service.client() as opd:
        assert opd.jobs.cancel(job["id"]).status == "cancelling"
    service.start_worker()

    done = service.wait(job["id"])
    assert done["status"] == "cancelled" and done["attempts"] == 1
    client = MlflowClient(mlflow_server.url)
    assert finished_run(client, job["mlflow_run_id"]).info.status == "KILLED"


def test_opd_run_resume_goes_on_with_the_same_run(tmp_path, mlflow_server):
    spec = mirrored_spec(mlflow_server.url, "cli", steps=6, save_every=2)
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    command = [sys.executable, "-m", "opd.cli", "run", "spec.yaml", "--metrics-out", "m.jsonl"]
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    first = subprocess.Popen(command, cwd=tmp_path, env=env, stderr=subprocess.DEVNULL)
    metrics = tmp_path / "m.jsonl"
    eventually(lambda: metrics.is_file() and len(metrics.read_text().splitlines()) >= 2, "steps")
    first.send_signal(signal.SIGINT)  # stops at the next step boundary, state saved
    assert first.wait(120) == 0
    run_id = (tmp_path / "runs" / "tiny-opd" / "mlflow_run_id").read_text()
    subprocess.run([*command, "--resume"], cwd=tmp_path, env=env, check=True, timeout=300)

    assert (tmp_path / "runs" / "tiny-opd" / "mlflow_run_id").read_text() == run_id
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    steps = {row.pop("step"): row for row in rows}
    assert sorted(steps) == list(range(6)) and len(rows) == 6  # each step once
    client = MlflowClient(mlflow_server.url)
    assert client.get_run(run_id).info.status == "FINISHED"
    assert_history_is(client, run_id, steps)
