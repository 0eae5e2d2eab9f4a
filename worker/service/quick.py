"""The worker's short tasks, answered while an API request waits (`app/core/worker_calls.py`):
`sample` (the playground) and `fetch_archive` (a PyTRIO checkpoint's archive). They run on
a queue and an arq worker of their own, beside the training jobs, with OPD_SAMPLE_CONCURRENCY
slots; each answers with an `Outcome` in JSON, its failures as codes and messages. As it
starts a task, it records the task's round (its score), so that a team's next task does not
go before the round being served (app/core/fair_queue.py).

A sample request stops at its deadline (the API has stopped waiting); the samplers it
loaded stay in the process's cache for the next one. An archive fetch runs to its end even
after the API stopped waiting, so that asking again finds the archive kept.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from arq.connections import RedisSettings
from arq.worker import Function, Worker, func
from pydantic import BaseModel

from app.core.config import Settings
from app.core.fair_queue import round_recorder
from app.core.storage import checkpoint_store
from app.core.worker_calls import FETCH_ARCHIVE_TASK, SAMPLE_TASK, quick_queue
from app.jobs.archives import fetched, keep_fetched
from kernel.errors import OPDError
from kernel.playground import (
    MAX_TIMEOUT_SECONDS,
    Archive,
    ArchiveTask,
    Outcome,
    SampleTask,
    TaskFailure,
)
from kernel.spec import JobSpec
from worker.engine.backends.vllm_served import ServedSamplers
from worker.engine.playground import answer
from worker.engine.rollouts.sampler_cache import SamplerCache

log = logging.getLogger(__name__)
T = TypeVar("T", bound=BaseModel)
MIB = 1024 * 1024
POLL_SECONDS = 0.02
"""How often the quick worker looks for tasks: a person is waiting."""
RESULT_SECONDS = 60
FAILED_FETCH_SECONDS = 10
"""How long a fetch's answer is kept: asking again within it joins that answer."""
FETCH_SECONDS = 6 * 3600
"""The longest an archive fetch may run (a large checkpoint on a slow link)."""
CONTEXT = "opd_quick"


@dataclass
class QuickContext:
    """What the quick tasks of one worker process share (arq's ctx["opd_quick"])."""

    settings: Settings
    samplers: SamplerCache


def quick_context(settings: Settings) -> QuickContext:
    """The samplers' cache, on the backends the specs name and, for a job that samples on
    vLLM, on the servers this worker is given (OPD_VLLM_SERVERS)."""
    from worker.engine.backends import connect

    playground = settings.artifact_root / "playground"
    store = checkpoint_store(settings)

    def open_backend(spec: JobSpec) -> Any:
        return connect(
            spec,
            playground,
            lambda message, data: log.warning("%s", message),
            store,
            settings.model_cache,
            lambda message, data: log.info("%s", message),
        )

    samplers = SamplerCache(
        open_backend,
        settings.sampler_cache_entries,
        int(settings.sampler_cache_mb * MIB),
        served_samplers(settings),
    )
    return QuickContext(settings, samplers)


def served_samplers(settings: Settings) -> ServedSamplers | None:
    """The vLLM servers' samplers, with the student's tokenizer as the local backend
    reads it and a stored checkpoint fetched into this worker's cache first."""
    if not settings.vllm_servers:
        return None
    from worker.engine.backends.local.models import ModelCache, load_tokenizer

    models = ModelCache(settings.model_cache)
    store = checkpoint_store(settings)
    return ServedSamplers(
        settings.vllm_servers,
        lambda base_model: load_tokenizer(base_model, models),
        (lambda path: path) if store is None else store.local,
    )


async def close_samplers(arq_ctx: dict[str, Any]) -> None:
    """The worker stops: what its playground loaded into vLLM servers is unloaded."""
    await arq_ctx[CONTEXT].samplers.aclose()


async def outcome(work: Callable[[], Awaitable[T]]) -> str:
    """The work's result, or the failure a person can act on, as an Outcome's JSON."""
    try:
        return Outcome[Any](value=await work()).model_dump_json()
    except OPDError as error:
        failure = TaskFailure(code=error.code, message=str(error))
    except Exception as error:
        log.exception("a quick task failed")
        failure = TaskFailure(code="internal_error", message=f"{type(error).__name__}: {error}")
    return Outcome[Any](failure=failure).model_dump_json()


async def sample(arq_ctx: dict[str, Any], payload: str) -> str:
    """arq task `sample`: the playground's completions, within the request's deadline."""
    ctx: QuickContext = arq_ctx[CONTEXT]
    task = SampleTask.model_validate_json(payload)

    async def within_deadline() -> Any:
        remaining = task.deadline - time.time()
        if remaining <= 0:
            raise OPDError(
                "the request's deadline passed before a worker took it", code="deadline_passed"
            )
        try:
            return await asyncio.wait_for(answer(task, ctx.samplers), remaining)
        except TimeoutError:
            raise OPDError(
                "the worker did not finish before the request's deadline", code="deadline_passed"
            ) from None

    return await outcome(within_deadline)


async def fetch_archive(arq_ctx: dict[str, Any], payload: str) -> str:
    """arq task `fetch_archive`: a PyTRIO checkpoint's archive, kept under the artifact
    folder (a partial download is resumed)."""
    ctx: QuickContext = arq_ctx[CONTEXT]
    task = ArchiveTask.model_validate_json(payload)

    async def fetch() -> Archive:
        from worker.engine.backends.trio import download_archive

        destination = Path(task.destination)
        if not destination.resolve().is_relative_to(ctx.settings.artifact_root.resolve()):
            raise OPDError(f"{destination} is outside OPD_ARTIFACT_ROOT", code="bad_destination")
        if (kept := fetched(destination)) is not None:
            return kept
        partial = destination.with_name(destination.name + ".part")
        partial.parent.mkdir(parents=True, exist_ok=True)
        await download_archive(task.spec.trio, task.path, partial)
        return await asyncio.to_thread(keep_fetched, partial, destination)

    return await outcome(fetch)


def quick_functions() -> list[Function]:
    return [
        func(
            sample,
            name=SAMPLE_TASK,
            max_tries=1,
            timeout=MAX_TIMEOUT_SECONDS + 5,
            keep_result=RESULT_SECONDS,
        ),
        func(
            fetch_archive,
            name=FETCH_ARCHIVE_TASK,
            max_tries=1,
            timeout=FETCH_SECONDS,
            keep_result=FAILED_FETCH_SECONDS,
        ),
    ]


def quick_worker(settings: Settings, worker_class: type[Worker]) -> Worker:
    """The arq worker of the quick tasks: its own queue and slots, polled often, taking
    tasks in their rounds' order."""
    assert settings.redis_url is not None
    return worker_class(
        functions=quick_functions(),
        queue_name=quick_queue(settings.queue_name),
        redis_settings=RedisSettings.from_dsn(settings.redis_url),
        max_jobs=settings.sample_concurrency,
        poll_delay=POLL_SECONDS,
        handle_signals=False,
        on_job_start=round_recorder(quick_queue(settings.queue_name)),
        ctx={CONTEXT: quick_context(settings)},
        on_shutdown=close_samplers,
    )
