"""Fair dispatch and team limits, decided by the database (SQLite and Postgres): which job
starts next, that racing workers never start more of a team's jobs than its limit, and that
a team cannot queue more than its limit. Each test has a fresh database: the pick looks at
every queued job there is."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from sqlalchemy import func, select

from app.auth.keys import create_key
from app.jobs.limits import LIMIT_REASON, Limits, QueueFull, note_limits
from app.jobs.rows import get_job
from app.jobs.schemas import ACTIVE_STATUSES, JobStatus
from app.jobs.store import claim_job, claim_next, complete_job, create_job
from app.jobs.tables import Job
from app.monitoring.stats import service_stats
from app.teams.store import list_teams, set_limits
from kernel.spec import JobSpec
from tests.app.conftest import small_spec
from tests.support import migrated_database


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request: pytest.FixtureRequest, tmp_path) -> Iterator[str]:
    with migrated_database(request.param, tmp_path) as url:
        yield url


async def team(sessions, name: str) -> int:
    async with sessions() as session:
        return (await create_key(session, name)).team.id


async def submit(sessions, team_id: int, count: int = 1, priority: int = 0, **limits) -> list[int]:
    spec = JobSpec.model_validate(small_spec(priority=priority))
    async with sessions() as session:
        return [
            (await create_job(session, team_id, spec, limits=Limits(**limits))).job.id
            for _ in range(count)
        ]


async def start_next(sessions, worker: str = "w", limits: Limits | None = None) -> int | None:
    async with sessions() as session:
        job = await claim_next(session, worker, heartbeat_timeout=60, limits=limits)
    return None if job is None else job.id


async def finish(sessions, job_id: int, worker: str = "w") -> None:
    async with sessions() as session:
        await complete_job(session, job_id, worker, "/weights")


async def test_the_team_running_fewest_jobs_goes_first(sessions):
    a, b = await team(sessions, "a"), await team(sessions, "b")
    a_jobs = await submit(sessions, a, 3)
    (b_job,) = await submit(sessions, b)

    order = [await start_next(sessions) for _ in range(4)]

    # a1 waited longest; then B runs fewer (0 < 1); then A's next.
    assert order == [a_jobs[0], b_job, a_jobs[1], a_jobs[2]]
    assert await start_next(sessions) is None


async def test_priority_orders_a_teams_own_jobs_and_never_another_teams(sessions):
    a, b = await team(sessions, "a"), await team(sessions, "b")
    (a_low,) = await submit(sessions, a)
    (b_job,) = await submit(sessions, b)
    (a_high,) = await submit(sessions, a, priority=10)

    order = [await start_next(sessions) for _ in range(3)]

    assert order == [a_high, b_job, a_low]


async def test_a_team_at_its_running_limit_waits_with_a_reason(sessions):
    a, b = await team(sessions, "a"), await team(sessions, "b")
    async with sessions() as session:
        await set_limits(session, "a", {"max_running": 1}, Limits())
    first, second = await submit(sessions, a, 2)
    (b_job,) = await submit(sessions, b)

    assert [await start_next(sessions) for _ in range(3)] == [first, b_job, None]
    async with sessions() as session:
        await note_limits(session, Limits())
        waiting = await get_job(session, second)
        (view,) = await list_teams(session, Limits(), "a")
    assert waiting.status == JobStatus.queued
    assert waiting.queue_reason.startswith(LIMIT_REASON)
    assert "team 'a' runs 1 of at most 1 jobs at once" in waiting.queue_reason
    assert (view.running, view.queued, view.effective_max_running) == (1, 1, 1)
    async with sessions() as session:
        stats = await service_stats(session, heartbeat_timeout=60, window_seconds=60)
    assert stats.jobs_waiting_for_queue == 0, "it waits for its team, not for Redis"

    await finish(sessions, first)
    assert await start_next(sessions) == second
    async with sessions() as session:
        assert (await get_job(session, second)).queue_reason is None


async def test_a_new_job_over_the_running_limit_says_why_it_waits(sessions):
    a = await team(sessions, "a")
    await submit(sessions, a)
    assert await start_next(sessions, limits=Limits(max_running=1)) is not None

    (waiting,) = await submit(sessions, a, max_running=1)

    async with sessions() as session:
        reason = (await get_job(session, waiting)).queue_reason
    assert reason.startswith(LIMIT_REASON) and "1 of at most 1" in reason


async def test_racing_workers_never_start_more_than_a_teams_limit(sessions):
    a, b = await team(sessions, "a"), await team(sessions, "b")
    async with sessions() as session:
        await set_limits(session, "a", {"max_running": 2}, Limits())
    a_jobs = set(await submit(sessions, a, 12))
    b_jobs = set(await submit(sessions, b, 2))
    started: list[int] = []

    async def worker(name: str) -> None:
        while (job_id := await start_next(sessions, name)) is not None:
            started.append(job_id)

    for _ in range(6):  # six rounds: race, check, let the running ones end
        await asyncio.gather(*(worker(f"w{i}") for i in range(8)))
        async with sessions() as session:
            running = (
                await session.execute(
                    select(Job.team_id, func.count())
                    .where(Job.status.in_(ACTIVE_STATUSES))
                    .group_by(Job.team_id)
                )
            ).all()
            held = (
                await session.execute(
                    select(Job.id, Job.worker_id).where(Job.status == JobStatus.running)
                )
            ).all()
        assert dict(running).get(a, 0) <= 2, running
        for job_id, worker_id in held:
            async with sessions() as session:
                await complete_job(session, job_id, worker_id, "/weights")

    assert sorted(started) == sorted(a_jobs | b_jobs), "each job started once, none lost"


async def test_racing_claims_of_different_jobs_of_one_team_respect_its_limit(sessions):
    a = await team(sessions, "a")
    jobs = await submit(sessions, a, 8)

    async def claim(job_id: int) -> bool:
        async with sessions() as session:
            claimed = await claim_job(
                session, job_id, f"w{job_id}", heartbeat_timeout=60, limits=Limits(max_running=3)
            )
        return claimed is not None

    started = await asyncio.gather(*(claim(job_id) for job_id in jobs))

    assert sum(started) == 3
    async with sessions() as session:
        running = select(func.count()).where(Job.status == JobStatus.running)
        assert (await session.execute(running)).scalar_one() == 3


async def test_a_team_over_its_queued_limit_is_refused_and_nothing_is_stored(sessions):
    a = await team(sessions, "a")
    await submit(sessions, a, 2, max_queued=2)

    with pytest.raises(QueueFull, match=r"already has 2 queued jobs, its limit \(max_queued 2\)"):
        await submit(sessions, a, max_queued=2)

    async with sessions() as session:
        count = (await session.execute(select(func.count()).select_from(Job))).scalar_one()
    assert count == 2


async def test_racing_submissions_never_queue_more_than_the_limit(sessions):
    a = await team(sessions, "a")

    async def one() -> bool:
        try:
            await submit(sessions, a, max_queued=3)
        except QueueFull:
            return False
        return True

    accepted = await asyncio.gather(*(one() for _ in range(10)))

    assert sum(accepted) == 3
    async with sessions() as session:
        count = (await session.execute(select(func.count()).select_from(Job))).scalar_one()
    assert count == 3
