"""Where a queued job stands and why it waits (SQLite and Postgres, a fresh database each):
the order the queue is read in is the order fair dispatch then starts the jobs, a team's
running limit holds its jobs back, and the API, its lists and the dashboard say why each
queued job waits (tests/app/web/test_queue_places.py: the API and the dashboard say it)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest

from app.core.tables import utcnow
from app.jobs.limits import Limits
from app.jobs.places import waiting_reason
from app.jobs.schemas import QueuePlace
from app.jobs.store import claim_job
from app.jobs.workers import forget_worker, note_worker, read_board
from tests.app.jobs.test_fairness import start_next, team
from tests.app.jobs.test_fairness import submit as queue_jobs
from tests.support import migrated_database


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request: pytest.FixtureRequest, tmp_path) -> Iterator[str]:
    with migrated_database(request.param, tmp_path) as url:
        yield url


async def board(sessions, limits: Limits):
    async with sessions() as session:
        return await read_board(session, limits, utcnow() - timedelta(minutes=1))


async def test_the_queue_is_read_in_the_order_fair_dispatch_starts_it(sessions):
    a, b, c = [await team(sessions, name) for name in "abc"]
    a_jobs = await queue_jobs(sessions, a, 3)
    (b_low,) = await queue_jobs(sessions, b)
    (c_job,) = await queue_jobs(sessions, c)
    (b_high,) = await queue_jobs(sessions, b, priority=5)
    a_more = await queue_jobs(sessions, a, 2)
    limits = Limits(max_running=2)

    read = await board(sessions, limits)
    predicted = sorted(read.positions, key=read.positions.__getitem__)
    started = []
    while (job_id := await start_next(sessions, limits=limits)) is not None:
        started.append(job_id)

    assert predicted[: len(started)] == started
    assert read.held == {a_jobs[2], *a_more}, "team a runs 2, its limit: the rest wait for it"
    assert set(started) == {*a_jobs[:2], b_low, b_high, c_job}
    assert read.ahead_in_team[b_low] == 1, "b's own high-priority job starts first"


async def test_a_queued_job_says_what_it_waits_for(sessions):
    a, b = await team(sessions, "a"), await team(sessions, "b")
    (running,) = await queue_jobs(sessions, a)
    (a_next,) = await queue_jobs(sessions, a)
    (b_job,) = await queue_jobs(sessions, b)
    async with sessions() as session:
        await claim_job(session, running, "w1", heartbeat_timeout=60)

    nobody = (await board(sessions, Limits())).place(b_job, b)
    async with sessions() as session:
        await note_worker(session, "w1", 1, utcnow())
    one_slot = (await board(sessions, Limits())).place(b_job, b)
    async with sessions() as session:
        await note_worker(session, "w2", 3, utcnow())
    free = (await board(sessions, Limits())).place(a_next, a)
    async with sessions() as session:
        await forget_worker(session, "w2")
    held = (await board(sessions, Limits(max_running=1))).place(a_next, a)

    assert waiting_reason(nobody).startswith("No worker is running: it starts when one does")
    assert one_slot == QueuePlace(
        position=1,
        ahead=0,
        ahead_in_team=0,
        running=1,
        running_in_team=0,
        slots=1,
        held_by_team_limit=False,
    ), "b runs fewer jobs than a: b's job starts first"
    assert waiting_reason(one_slot) == (
        "Waiting for a worker slot: the workers have 1, and 1 job runs now (0 of its team's, "
        "1 of other teams'); 0 jobs start before it (0 of its team's); position 1 in the queue"
    )
    assert (free.position, free.ahead, free.slots) == (2, 1, 4)
    assert waiting_reason(free) == "Starting: 3 of 4 worker slots are free"
    assert held.held_by_team_limit and waiting_reason(held).startswith(
        "Its team runs 1 jobs, as many as it may at once"
    )
