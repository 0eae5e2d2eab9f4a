"""The quick tasks' order across teams (app/core/fair_queue.py), on the real Redis with a
real arq worker of one slot that records the order it starts tasks in: a team with one
task waits behind at most one task of each other team, however many they queued, and
whenever it arrives; busy teams take turns, each in its own order, a newcomer from the round
being served."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from arq.connections import ArqRedis, RedisSettings, create_pool
from arq.worker import Worker, func

from app.core.fair_queue import place, round_recorder
from tests.support import REDIS_URL

WAIT = timedelta(seconds=60)
TEAMS = {"beta": 2, "gamma": 3, "omega": 1}
"""Omega is the team with one task: its ids sort after the others', so it loses every tie
of a round (arq breaks them by id), the worst case."""


@pytest.fixture
async def pool(redis) -> Any:
    connection = await create_pool(RedisSettings.from_dsn(REDIS_URL))
    yield connection
    await connection.aclose()


async def send(
    pool: ArqRedis, queue_name: str, team: str, count: int = 1, first: int = 0
) -> list[str]:
    """`count` tasks of the team, named `team-i` from i = `first`, placed one by one."""
    names = [f"{team}-{index}" for index in range(first, first + count)]
    for name in names:
        await place(pool, queue_name, TEAMS[team], f"{queue_name}:{name}", "task", name, WAIT)
    return names


async def started(
    queue_name: str, on_start: dict[str, Callable[[], Any]] | None = None
) -> list[str]:
    """The names of the queue's tasks in the order a worker with one slot starts them,
    until none is left; `on_start[name]()` runs as the task of that name starts."""
    order: list[str] = []

    async def task(ctx: dict[str, Any], name: str) -> None:
        order.append(name)
        if on_start and name in on_start:
            await on_start[name]()

    worker = Worker(
        functions=[func(task, name="task")],
        queue_name=queue_name,
        redis_settings=RedisSettings.from_dsn(REDIS_URL),
        max_jobs=1,
        burst=True,
        poll_delay=0.01,
        handle_signals=False,
        on_job_start=round_recorder(queue_name),
    )
    try:
        await worker.main()
    finally:
        await worker.close()
    return order


def before(order: list[str], name: str, team: str) -> int:
    """How many of the team's tasks started before the task `name`."""
    return sum(1 for earlier in order[: order.index(name)] if earlier.startswith(team))


async def test_one_task_waits_behind_at_most_one_of_each_team_that_queued_many(pool, queue_name):
    await send(pool, queue_name, "beta", 20)
    await send(pool, queue_name, "gamma", 20)
    await send(pool, queue_name, "omega")

    order = await started(queue_name)

    assert len(order) == 41
    assert before(order, "omega-0", "beta") <= 1 and before(order, "gamma-0", "beta") <= 1
    assert before(order, "omega-0", "gamma") <= 1


async def test_a_team_arriving_while_another_is_served_waits_behind_at_most_one_of_its_tasks(
    pool, queue_name
):
    await send(pool, queue_name, "beta", 20)

    async def omega_arrives() -> None:
        await send(pool, queue_name, "omega")

    order = await started(queue_name, {"beta-9": omega_arrives})

    arrived = order.index("beta-9")
    assert order[: arrived + 1] == [f"beta-{index}" for index in range(10)]
    assert order.index("omega-0") - arrived - 1 <= 1, order


async def test_busy_teams_take_turns_each_in_its_own_order(pool, queue_name):
    await send(pool, queue_name, "beta", 6)
    await send(pool, queue_name, "gamma", 6)

    order = await started(queue_name)

    for team in ("beta", "gamma"):
        assert [name for name in order if name.startswith(team)] == [
            f"{team}-{index}" for index in range(6)
        ]
    turns = [{name.split("-")[0] for name in order[at : at + 2]} for at in range(0, 12, 2)]
    assert turns == [{"beta", "gamma"}] * 6, order


async def test_a_busy_team_arriving_midway_takes_turns_from_the_round_being_served(
    pool, queue_name
):
    """Not from the first round: gamma does not catch up on the rounds beta had alone."""
    await send(pool, queue_name, "beta", 10)

    async def gamma_arrives() -> None:
        await send(pool, queue_name, "gamma", 6)

    order = await started(queue_name, {"beta-4": gamma_arrives})

    assert order[:6] == [f"beta-{index}" for index in range(5)] + ["gamma-0"], order
    turns = [set(order[at : at + 2]) for at in range(6, 16, 2)]
    assert turns == [{f"beta-{index}", f"gamma-{index - 4}"} for index in range(5, 10)], order


async def test_a_team_served_last_is_not_held_back_behind_a_new_burst(pool, queue_name):
    """Omega had the round being served; beta then queues 10: omega's next task is still
    behind at most one of beta's (a team with nothing waiting joins the round served)."""
    await send(pool, queue_name, "omega", 5)
    assert await started(queue_name) == [f"omega-{index}" for index in range(5)]
    await send(pool, queue_name, "beta", 10)
    await send(pool, queue_name, "omega", first=10)

    order = await started(queue_name)

    assert before(order, "omega-10", "beta") <= 1, order


async def test_tasks_withdrawn_unanswered_do_not_hold_their_team_back(pool, queue_name):
    """As call_worker withdraws a task no worker took in time."""
    names = await send(pool, queue_name, "omega", 10)
    await pool.zrem(queue_name, *(f"{queue_name}:{name}" for name in names))
    await send(pool, queue_name, "beta", 10)
    await send(pool, queue_name, "omega", first=10)

    order = await started(queue_name)

    assert "omega-0" not in order and before(order, "omega-10", "beta") <= 1, order


async def test_a_task_of_an_id_already_queued_is_joined_not_queued_again(pool, queue_name):
    task_id = f"{queue_name}:archive-7"
    first = await place(pool, queue_name, TEAMS["omega"], task_id, "task", "first", WAIT)
    second = await place(pool, queue_name, TEAMS["omega"], task_id, "task", "second", WAIT)

    assert first is not None and second is None
    assert await started(queue_name) == ["first"]
