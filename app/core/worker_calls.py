"""Short tasks a worker does for the API (sampling a checkpoint, fetching a remote
checkpoint's archive), answered while the request waits.

They travel through Redis on a queue of their own (`<OPD_QUEUE_NAME>:quick`), which every
worker process serves beside its training jobs with slots of its own, so a long training
job never holds one up. Each task has a deadline: it expires in Redis if no worker takes
it by then, and past it the caller stops waiting. Workers take the tasks of all teams in
turns (app/core/fair_queue.py), not first come first served. As with jobs, the API
imports no worker code: tasks go by name, with JSON payloads and answers
(`kernel/playground.py`).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import timedelta

from arq.jobs import Job
from redis.exceptions import RedisError

from app.core.fair_queue import place
from app.core.queue import JobQueue, QueueUnavailable, redis_address
from kernel.playground import TaskFailure

SAMPLE_TASK = "sample"
FETCH_ARCHIVE_TASK = "fetch_archive"
RESULT_POLL_SECONDS = 0.02


def quick_queue(queue_name: str) -> str:
    return f"{queue_name}:quick"


@dataclass
class TaskUnanswered(Exception):
    """No worker answered before the deadline, or the task failed before answering."""

    failure: TaskFailure


async def call_worker(
    queue: JobQueue,
    task: str,
    payload: str,
    timeout: float,
    team_id: int,
    task_id: str | None = None,
) -> str:
    """Send `task`, in the team's turn, and wait at most `timeout` seconds for its
    answer. A `task_id` makes the call join a task of that id already sent (one fetch per
    archive, however many ask); without one, a task nobody answered in time is withdrawn."""
    pool = await queue.connection()
    name = quick_queue(queue.queue_name)
    arq_id = f"{name}:{task_id or f'{task}-{uuid.uuid4().hex}'}"
    try:
        sent = await place(pool, name, team_id, arq_id, task, payload, timedelta(seconds=timeout))
        job = sent or Job(arq_id, pool, _queue_name=name)
        return await job.result(timeout=timeout, poll_delay=RESULT_POLL_SECONDS)
    except TimeoutError as error:
        if task_id is None:
            await pool.zrem(name, arq_id)
        raise TaskUnanswered(
            TaskFailure(
                code="worker_timeout",
                message=f"no worker answered within {timeout:g} s: the workers may be down, "
                "or busy with other such requests (each takes OPD_SAMPLE_CONCURRENCY at once)",
            )
        ) from error
    except (OSError, RedisError) as error:
        await queue.close()
        raise QueueUnavailable(
            f"Redis at {redis_address(queue.redis_url)} did not answer ({task}): {error}"
        ) from error
    except Exception as error:  # arq's own failure: the task expired or its worker died
        raise TaskUnanswered(
            TaskFailure(code="worker_failed", message=f"the worker did not finish: {error}")
        ) from error
