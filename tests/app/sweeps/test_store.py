"""Reading sweeps without reading curves: a sweep's page and list read no metric point (the
trials' last points are kept on their rows as steps are recorded, a custom metric too), and
the one point a judgment needs is read from a block of step rows and a block summary."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import event, update

from app.core.tables import utcnow
from app.jobs.schemas import JobStatus
from app.jobs.store import claim_job, create_job
from app.jobs.tables import Job
from app.records.store import record_step
from app.sweeps.rungs import points_at
from app.sweeps.schemas import SweepCreate
from app.sweeps.service import list_sweeps, read_sweep
from app.sweeps.store import create_sweep
from kernel.spec import JobSpec
from tests.app.conftest import small_spec

METRIC = "custom/score"  # no summary metric: kept on the row because the sweep names it


@contextmanager
def statements(sessions) -> Iterator[list[str]]:
    """The SQL the sessions' engine sends meanwhile."""
    engine = sessions.kw["bind"].sync_engine
    seen: list[str] = []

    def note(conn, cursor, statement, parameters, context, executemany) -> None:
        seen.append(statement)

    event.listen(engine, "before_cursor_execute", note)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", note)


async def running_job(session, team_id: int, sweep: tuple[int, int] | None = None) -> int:
    spec = JobSpec.model_validate(small_spec(loop={"steps": 100}))
    job = (await create_job(session, team_id, spec, trial=sweep)).job
    assert await claim_job(session, job.id, "w", heartbeat_timeout=60) is not None
    return job.id


def last_by(rows: list[tuple[int, dict]], key: str, step: int) -> float | str | None:
    """The brute-force answer: the last recorded value at or before `step` ("none")."""
    found = [metrics[key] for at, metrics in rows if at <= step and key in metrics]
    return found[-1] if found else "none"


async def test_the_point_at_a_rung_is_the_last_recorded_by_then(session, key):
    """An eval-like metric every third step (one not finite), read at rungs on and off
    block edges, against the rows themselves."""
    job_id = await running_job(session, key.team.id)
    rows = []
    for at in range(45):
        metrics = {"train": float(at)}
        if at % 3 == 0:
            metrics[METRIC] = float("nan") if at == 21 else at / 10
        await record_step(session, job_id, "w", at, metrics)
        rows.append((at, {k: None if v != v else v for k, v in metrics.items()}))

    for rung in (0, 1, 2, 3, 4, 7, 8, 15, 16, 17, 21, 22, 23, 30, 40, 44):
        found = await points_at(session, METRIC, [job_id], rung)
        assert found.get(job_id, "none") == last_by(rows, METRIC, rung), rung
    assert await points_at(session, "never/recorded", [job_id], 30) == {}


def score_sweep() -> SweepCreate:
    return SweepCreate.model_validate(
        {
            "name": "reads",
            "base": small_spec(loop={"steps": 100}),
            "parameters": {"optim.learning_rate": {"values": [1e-3, 2e-3, 3e-3, 4e-3]}},
            "method": "grid",
            "metric": {"name": METRIC, "goal": "maximize"},
            "max_trials": 4,
        }
    )


async def test_reading_a_sweep_reads_no_metric_point(sessions, session, key):
    """Four trials: two succeeded (the better is the best), one succeeded whose last point
    was not finite (not comparable), one still running. The page and the list show their
    last points from the job rows alone."""
    sweep, _ = await create_sweep(session, key.team.id, score_sweep())
    lasts = (0.5, 0.7, float("inf"), 0.9)
    trials = [await running_job(session, key.team.id, (sweep.id, n)) for n in (1, 2, 3, 4)]
    for job_id, last in zip(trials, lasts, strict=True):
        for at in range(12):
            await record_step(session, job_id, "w", at, {METRIC: 0.1 * at, "train": 1.0})
        await record_step(session, job_id, "w", 12, {METRIC: last})
    done = update(Job).where(Job.id.in_(trials[:3]))
    await session.execute(done.values(status=JobStatus.succeeded, finished_at=utcnow()))
    await session.commit()

    with statements(sessions) as seen:
        detail = await read_sweep(session, sweep.id)
        listed, _ = await list_sweeps(session, key.team.id, None, 10)
    assert seen and not [s for s in seen if "step_metrics" in s or "metric_summaries" in s]

    assert [(t.metric, t.metric_step) for t in detail.trials] == [
        (0.5, 12),
        (0.7, 12),
        (None, 12),
        (0.9, 12),
    ]
    assert [t.best_so_far for t in detail.trials] == [0.5, 0.7, 0.7, 0.7]
    rate = JobSpec.model_validate(small_spec()).optim.learning_rate  # read out of each spec
    assert [t.values for t in detail.trials] == [{"optim.learning_rate": rate}] * 4
    assert detail.best is not None and detail.best.number == 2
    assert listed[0].model_dump() == detail.model_dump(exclude={"trials"})
