"""The order in which workers take the quick tasks (app/core/worker_calls.py): in rounds,
fairly across teams, whichever API process sent a task and whichever worker takes it.

arq's queue is a Redis sorted set, and a worker starts the due tasks lowest score first.
arq's scores are times, so the order would be first come, first served, and a team sending
64 prompts at once would make every other team wait behind all 64. Here a task's score is
a round number instead (start-time fair queueing):
- a team with a task still waiting (queued, not started) gets the round after that one's;
- a team with none waiting gets the round being served (the highest a worker has started).
So a team's 64 tasks fill 64 rounds, one each, and a team arriving meanwhile with one task
gets the round being served: since no team has two tasks waiting in one round, it waits
behind at most one task of each other team, however many they queued.

Why this and not a queue per team and a dispatcher: arq's queue and workers stay as they
are (a task is still one sorted-set entry, withdrawn, expired and joined as before), and
each half of the rule is one atomic Redis script (placing a task, a worker starting one),
so API processes and workers on many machines share it with no process of its own. The
script that places a task writes it as arq's `enqueue_job` does (its job key and its queue
entry; arq is pinned below 0.29), so that the team's last task is always the one it
reads. Rounds are small integers, always due (far below any time in milliseconds; arq's
log reads a round as a task's delay)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

from arq.connections import ArqRedis
from arq.constants import in_progress_key_prefix, job_key_prefix, result_key_prefix
from arq.jobs import Job, serialize_job
from arq.utils import timestamp_ms
from redis.exceptions import RedisError

log = logging.getLogger(__name__)

FIRST_ROUND = 1
"""arq takes a score of 0 for a task already gone."""

PLACE = """
if redis.call('EXISTS', KEYS[2], KEYS[3]) > 0 then return 0 end
local round = tonumber(redis.call('GET', KEYS[4]) or ARGV[5])
local last = redis.call('GET', KEYS[5])
if last then
  local score = redis.call('ZSCORE', KEYS[1], last)
  if score and redis.call('EXISTS', ARGV[4] .. last) == 0 then
    round = math.max(round, tonumber(score) + 1)
  end
end
redis.call('PSETEX', KEYS[2], ARGV[3], ARGV[2])
redis.call('ZADD', KEYS[1], round, ARGV[1])
redis.call('SET', KEYS[5], ARGV[1], 'PX', ARGV[3])
return round
"""
"""Queue a task (unless one of its id is queued or answered: 0) in the team's next round.
KEYS: the queue, the task's job and result keys, the round served, the team's last task;
ARGV: the task's id, its serialized job, how long it may wait (ms), arq's in-progress
prefix, the first round. A task still in the queue with no in-progress key is waiting."""

SERVED = """
if tonumber(ARGV[1]) > tonumber(redis.call('GET', KEYS[1]) or '0') then
  redis.call('SET', KEYS[1], ARGV[1])
end
"""
"""A worker started a task of round ARGV[1]: the round served is at least that."""


def served_key(queue_name: str) -> str:
    return f"{queue_name}:round-served"


def last_task_key(queue_name: str, team_id: int) -> str:
    return f"{queue_name}:last-task:team-{team_id}"


async def place(
    pool: ArqRedis,
    queue_name: str,
    team_id: int,
    task_id: str,
    function: str,
    payload: str,
    wait: timedelta,
) -> Job | None:
    """Queue `function(payload)` as the task `task_id` of the team, in its next round,
    expiring unless a worker takes it within `wait`; None when a task of that id is
    already queued or answered (join it)."""
    job = serialize_job(
        function, (payload,), {}, None, timestamp_ms(), serializer=pool.job_serializer
    )
    keys = (
        queue_name,
        job_key_prefix + task_id,
        result_key_prefix + task_id,
        served_key(queue_name),
        last_task_key(queue_name, team_id),
    )
    wait_ms = max(1, round(wait.total_seconds() * 1000))
    args = (task_id, job, wait_ms, in_progress_key_prefix, FIRST_ROUND)
    placed = await pool.eval(PLACE, len(keys), *keys, *args)  # type: ignore[misc]
    if not placed:
        return None
    return Job(task_id, pool, _queue_name=queue_name, _deserializer=pool.job_deserializer)


def round_recorder(queue_name: str) -> Callable[[dict[str, Any]], Awaitable[None]]:
    """arq's `on_job_start` hook for the queue: the round of a task that starts (its score)
    is served. Should Redis be away, the task runs anyway (the next one records a later
    round)."""

    async def record(arq_ctx: dict[str, Any]) -> None:
        try:
            await arq_ctx["redis"].eval(SERVED, 1, served_key(queue_name), arq_ctx["score"])
        except (RedisError, OSError) as error:
            log.warning("could not record the round of task %s: %s", arq_ctx["job_id"], error)

    return record
