"""Sweeps against real processes: the API and workers, driven over HTTP and `opd sweeps`.
A grid runs every point once within `parallel` and the team's running limit; a worker
killed with -9 while it holds the controller loses and doubles no trial; ASHA stops the
trials that lose at a rung, keeping their state; no sweep trains on another team's
weights."""

from __future__ import annotations

import asyncio
import itertools
import signal
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from sqlalchemy import create_engine, select, text

from app.auth.tables import Team
from app.core.db import create_db_engine, session_factory, sync_url
from app.jobs.schemas import TERMINAL_STATUSES
from app.sweeps.schemas import SweepCreate, SweepDetail
from app.sweeps.store import create_sweep
from opd.sdk import Client
from tests.e2e.conftest import Service, deployment, tiny_spec
from tests.e2e.test_faults import metric_rows

FAST = {"sampling": {"max_tokens": 8}}
LOSSES = ["importance_sampling", "ppo"]
RATES = [1.0e-3, 3.0e-3]
METRIC = "opd/reverse_kl_mean"


def grid_sweep(steps: int, parallel: int, save_every: int = 0, **extra: Any) -> dict[str, Any]:
    loop = {"steps": steps, "batch_size": 1, "group_size": 2, "save_every": save_every}
    return {
        "name": "grid",
        "base": tiny_spec(**loop) | FAST,
        "parameters": {
            "loop.loss_fn": {"values": LOSSES},
            "optim.learning_rate": {"values": RATES},
        },
        "method": "grid",
        "metric": {"name": METRIC, "goal": "minimize"},
        "max_trials": 4,
        "parallel": parallel,
        **extra,
    }


def create(service: Service, definition: dict[str, Any]) -> SweepDetail:
    with service.client() as client:
        return client.sweeps.create(definition)


def wait_sweep(
    service: Service, sweep_id: int, until: Any = None, timeout: float = 240
) -> SweepDetail:
    until = until or (lambda sweep: sweep.status != "running")
    deadline = time.monotonic() + timeout
    with service.client() as client:
        while True:
            sweep = client.sweeps.get(sweep_id)
            if until(sweep):
                return sweep
            assert time.monotonic() < deadline, f"sweep stuck: {sweep}\n{service.logs()}"
            time.sleep(0.25)


def trial_rows(service: Service, sweep_id: int) -> list[dict[str, Any]]:
    """The sweep's trial jobs straight from the database: a duplicate would show here."""
    engine = create_engine(sync_url(service.env["OPD_DATABASE_URL"]))
    with engine.connect() as connection:
        rows = connection.execute(
            text(
                "SELECT id, sweep_trial, status, created_at, started_at, finished_at FROM jobs"
                " WHERE sweep_id = :id ORDER BY sweep_trial"
            ),
            {"id": sweep_id},
        )
        found = [dict(row._mapping) for row in rows]
    engine.dispose()
    for row in found:
        for column in ("created_at", "started_at", "finished_at"):
            if isinstance(row[column], str):
                row[column] = datetime.fromisoformat(row[column])
            if row[column] is not None:
                row[column] = row[column].replace(tzinfo=None)
    return found


def most_at_once(intervals: list[tuple[datetime, datetime]]) -> int:
    """The most intervals open at one moment."""
    edges = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    open_now = most = 0
    for _, change in edges:
        open_now += change
        most = max(most, open_now)
    return most


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
def test_grid_runs_every_point_once_within_parallel_and_the_teams_limit(
    tmp_path: Path, database_url: str
) -> None:
    with deployment(tmp_path, database_url, team_max_running="1", sweeps_interval="0.2") as service:
        service.start_worker(OPD_WORKER_CONCURRENCY="2")
        created = service.opd(
            "sweeps", "create", write(tmp_path, grid_sweep(4, 2)), "--quiet", *api(service)
        )
        sweep = wait_sweep(service, int(created.stdout))
        assert sweep.status == "completed", service.logs()

        trials = sweep.trials
        assert [t.number for t in trials] == [1, 2, 3, 4]
        assert tried(sweep) == set(itertools.product(LOSSES, RATES))
        assert all(t.status == "succeeded" and t.metric is not None for t in trials)
        best = min(trials, key=lambda t: t.metric or 0.0)
        assert sweep.best is not None and sweep.best.number == best.number
        assert trials[-1].best_so_far == best.metric

        rows = trial_rows(service, sweep.id)
        assert [row["sweep_trial"] for row in rows] == [1, 2, 3, 4]
        runs = [(row["started_at"], row["finished_at"]) for row in rows]
        assert most_at_once(runs) == 1  # the team's running limit
        unfinished = [(row["created_at"], row["finished_at"]) for row in rows]
        assert most_at_once(unfinished) == 2  # parallel

        with service.client() as client:
            listed = {(job.sweep_id, job.sweep_trial) for job in client.jobs.list()}
        assert listed == {(sweep.id, n) for n in (1, 2, 3, 4)}
        status = service.opd("sweeps", "status", str(sweep.id), *api(service)).stdout.splitlines()
        table = [line.split() for line in status[3:-1]]
        assert [int(row[0]) for row in table] == [
            t.number for t in sorted(trials, key=lambda t: t.metric or 0.0)
        ]


def tried(sweep: SweepDetail) -> set[tuple[Any, Any]]:
    """The (loss, learning rate) points the sweep's trials ran."""
    return {(t.values["loop.loss_fn"], t.values["optim.learning_rate"]) for t in sweep.trials}


def api(service: Service) -> tuple[str, ...]:
    return ("--url", service.url, "--key", service.key)


def write(folder: Path, definition: dict[str, Any]) -> str:
    path = folder / "sweep.yaml"
    path.write_text(yaml.safe_dump(definition))
    return str(path)


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_kill_9_of_the_controllers_worker_loses_and_doubles_no_trial(
    tmp_path: Path, database_url: str
) -> None:
    with deployment(tmp_path, database_url, sweeps_interval="0.2") as service:
        first = service.start_worker(OPD_WORKER_CONCURRENCY="2")
        sweep = create(service, grid_sweep(12, 2, save_every=2))

        def midway(sweep: SweepDetail) -> bool:
            return any(t.steps_done >= 3 for t in sweep.trials)

        wait_sweep(service, sweep.id, midway)
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        service.start_worker(OPD_WORKER_CONCURRENCY="2")
        sweep = wait_sweep(service, sweep.id)

        assert sweep.status == "completed", service.logs()
        rows = trial_rows(service, sweep.id)
        assert [row["sweep_trial"] for row in rows] == [1, 2, 3, 4]
        assert {row["status"] for row in rows} == {"succeeded"}
        for row in rows:
            assert [step for step, _ in metric_rows(service, row["id"])] == list(range(12))
        assert tried(sweep) == set(itertools.product(LOSSES, RATES))


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_asha_stops_the_trials_that_lose_at_a_rung_and_keeps_their_state(
    tmp_path: Path, database_url: str
) -> None:
    """One trial at a time, so each is judged against the finished ones: a trial that is
    not the best so far at rung 4 is stopped there (eta 2 keeps the best half, at least 1)."""
    definition = grid_sweep(
        30,
        1,
        parameters={"optim.learning_rate": {"values": [3.0e-3, 1.0e-6, 1.0e-2]}},
        max_trials=3,
        early_stop={"type": "asha", "min_steps": 4, "eta": 2},
    )
    with deployment(tmp_path, database_url, sweeps_interval="0.1") as service:
        service.start_worker()
        sweep = wait_sweep(service, create(service, definition).id)
        assert sweep.status == "completed", service.logs()
        trials = sweep.trials
        with service.client() as client:
            jobs = {t.number: client.jobs.get(t.job_id) for t in trials}
        curves = {t.number: service.curve(t.job_id, METRIC) for t in trials}
        rungs = {t.number: stop_rung(service, t.job_id) for t in trials}

    judged = [n for n, rung in rungs.items() if rung is not None]
    stopped = [n for n in judged if trials[n - 1].status == "cancelled"]
    assert stopped, trials
    assert 1 not in judged  # alone at its rungs, the first trial is the best there
    for trial in trials:
        number = trial.number
        if number not in judged:
            assert trial.status == "succeeded"
            assert trial.stop_reason is None
            continue
        rung = rungs[number]
        earlier = [value_at(curves[n], rung) for n in range(1, number) if curves[n][-1][0] >= rung]
        assert value_at(curves[number], rung) > min(earlier)  # it lost at the rung
        if number not in stopped:  # it ended before its worker heard: it was not stopped
            assert (trial.status, trial.stop_reason) == ("succeeded", None)
            continue
        assert trial.stop_reason == jobs[number].stop_reason == "early_stopped"
        assert jobs[number].last_state_path  # its state is kept
        assert trial.steps_done < trial.total_steps
    saved = sum(t.total_steps - t.steps_done for t in trials if t.number in stopped)
    assert sweep.steps_saved == saved > 0


def stop_rung(service: Service, job_id: int) -> int | None:
    """The rung the controller's stop names in the job's events (None: never stopped)."""
    events = service.events(job_id)
    rungs = [e.data["rung"] for e in events if e.message.startswith("Early stopped")]
    return rungs[0] if rungs else None


def value_at(curve: list[tuple[int, float | None]], step: int) -> float:
    return next(value for at, value in reversed(curve) if at <= step and value is not None)


def store_sweep(service: Service, team: str, definition: dict[str, Any]) -> int:
    """A sweep written straight to the database, past the API's checks (as one stored
    before they existed would be); returns its id."""

    async def store() -> int:
        engine = create_db_engine(service.env["OPD_DATABASE_URL"])
        try:
            async with session_factory(engine)() as session:
                query = select(Team.id).where(Team.name == team)
                team_id = (await session.execute(query)).scalar_one()
                sweep, _ = await create_sweep(
                    session, team_id, SweepCreate.model_validate(definition)
                )
                return sweep.id or 0
        finally:
            await engine.dispose()

    return asyncio.run(store())


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
def test_a_sweep_never_trains_on_another_teams_weights(tmp_path: Path, database_url: str) -> None:
    """The finding, against real processes: a sweep over `teacher.init_from.path` with the
    weights another team's job saved is a 422 naming the parameter (so is one over its job);
    a sweep stored past that check gets a trial that fails with the reason, having run
    nothing, and ends."""
    with deployment(tmp_path, database_url, sweeps_interval="0.2") as service:
        service.start_worker()
        other = service.opd("keys", "create", "--team", "other").stdout.strip()
        with Client(service.url, other) as client:
            trained = client.jobs.create(tiny_spec(steps=2, batch_size=1, group_size=2) | FAST)
            deadline = time.monotonic() + 180
            while (theirs := client.jobs.get(trained.id)).status not in TERMINAL_STATUSES:
                assert time.monotonic() < deadline, service.logs()
                time.sleep(0.25)
        assert theirs.status == "succeeded", service.logs()
        weights = theirs.final_weights_path
        assert weights is not None

        base = tiny_spec(steps=2, batch_size=1, group_size=2) | FAST
        base["teacher"] = {"base_model": "tiny-student"}
        definition = {
            "name": "borrowed",
            "base": base,
            "parameters": {"teacher.init_from.path": {"values": [weights]}},
            "method": "grid",
            "metric": {"name": METRIC, "goal": "minimize"},
            "max_trials": 1,
        }
        headers = {"Authorization": f"Bearer {service.key}"}
        for parameter in (
            {"teacher.init_from.path": {"values": [weights]}},
            {"teacher.init_from.job": {"values": [trained.id]}},
        ):
            response = httpx.post(
                f"{service.url}/v1/sweeps",
                json=definition | {"parameters": parameter},
                headers=headers,
                timeout=30,
            )
            assert response.status_code == 422, response.text
            assert response.json()["error"]["param"] == f"parameters.{next(iter(parameter))}"
            assert weights not in response.text

        sweep = wait_sweep(service, store_sweep(service, "e2e", definition))
        assert sweep.status == "completed", service.logs()
        (trial,) = sweep.trials
        job = service.wait(trial.job_id)
        assert (job["status"], job["error"]["code"]) == ("failed", "spec_refused")
        assert job["error"]["message"].startswith(
            "teacher.init_from.path: is filled by the service"
        )
        assert job["started_at"] is None and metric_rows(service, trial.job_id) == []
