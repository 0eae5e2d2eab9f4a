"""The fixtures of the tests that sample a trio job's weights through the API: the API
with a worker's quick tasks beside it, and the module's job (`job_spec`) run to its end on
the module's PyTRIO fake (`pytrio_fake`)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from arq.worker import Worker

from tests.app.conftest import auth, serve
from worker.service.quick import quick_worker
from worker.service.tasks import WorkerContext, run_job


@pytest.fixture
async def api(settings, pytrio_fake) -> AsyncIterator[Any]:
    """The API and, beside it, a worker's quick tasks, sharing the settings."""
    worker = quick_worker(settings, Worker)
    answering = asyncio.create_task(worker.async_run())
    async with serve(settings) as http:
        yield http
    answering.cancel()
    await worker.close()


@pytest.fixture
async def trained(api, key, settings, sessions, queue, job_spec) -> dict[str, Any]:
    """A trio job submitted through the API and run to its end on the fake."""
    job = (await api.post("/v1/jobs", json=job_spec, headers=auth(key))).json()
    context = WorkerContext(settings, sessions, queue, "worker-1")
    assert await run_job({"opd": context}, job["id"]) == f"job {job['id']}: succeeded"
    return (await api.get(f"/v1/jobs/{job['id']}", headers=auth(key))).json()
