"""The sweep controller as a worker runs it: passes that take up work for a budget and
give every sweep its turn, on a thread of its own that needs nothing of the worker's
event loop."""

from __future__ import annotations

import time

from sqlalchemy import func, select

from app.core.db import create_sync_engine
from app.jobs.tables import Job
from app.sweeps.store import create_sweep
from tests.app.sweeps.test_control import random_sweep
from worker.service.sweep_controller import ControllerThread, control_sweeps

OWNER = "controller-a"


async def trial_counts(session, sweep_ids: list[int]) -> list[int]:
    counts = []
    for sweep_id in sweep_ids:
        query = select(func.count()).where(Job.sweep_id == sweep_id)
        counts.append((await session.execute(query)).scalar_one())
    return counts


async def test_a_pass_past_its_budget_leaves_the_next_sweeps_to_the_next_pass(
    sessions, session, key, queue, settings
):
    """With no time to spend, each pass advances one sweep, the one after the last."""
    sweeps = [(await create_sweep(session, key.team.id, random_sweep()))[0].id for _ in range(2)]

    first = await control_sweeps(sessions, queue, settings, OWNER, budget=0.0)
    assert (first.last, await trial_counts(session, sweeps)) == (sweeps[0], [3, 0])
    second = await control_sweeps(sessions, queue, settings, OWNER, first.last, budget=0.0)
    assert (second.last, await trial_counts(session, sweeps)) == (sweeps[1], [3, 3])
    assert (await control_sweeps(sessions, queue, settings, OWNER, second.last)).last == sweeps[1]


async def test_the_controller_runs_while_the_workers_event_loop_is_held(session, key, settings):
    """The test holds its event loop (a blocking wait, as a long synchronous computation
    would) while the controller thread creates the sweep's first trials."""
    sweep, _ = await create_sweep(session, key.team.id, random_sweep())
    controller = ControllerThread(settings.model_copy(update={"sweeps_interval": 0.05}), OWNER)
    engine = create_sync_engine(settings.database_url)
    controller.start()
    try:
        deadline = time.monotonic() + 60
        with engine.connect() as connection:
            count = select(func.count()).where(Job.sweep_id == sweep.id)
            while connection.execute(count).scalar_one() < 3 and time.monotonic() < deadline:
                connection.rollback()
                time.sleep(0.05)  # holds this thread's event loop
            assert connection.execute(count).scalar_one() == 3
    finally:
        controller.stop()
        engine.dispose()
    assert not controller.thread.is_alive()
