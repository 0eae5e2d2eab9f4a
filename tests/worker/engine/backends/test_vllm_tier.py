"""A student's vLLM tier (OPD_VLLM_REPLICAS): each job of a worker samples on the server of
its base model with the fewest of the worker's jobs, its adapters all there; a resumed
attempt clears what an earlier one left on any server of the tier. Real HTTP servers that
keep adapters as vLLM's runtime LoRA loading does."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI

from app.core.config import Settings
from kernel.retry import Backoff
from tests.fakes.vllm_server import serving
from worker.engine.backends.vllm import JOBS_ON, VLLMServer

BASE = "smollm2-135m-instruct"


class Adapters:
    """A server's model list and its runtime LoRA loading, nothing else."""

    def __init__(self) -> None:
        self.loaded: set[str] = set()

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.get("/v1/models")
        async def models() -> dict[str, Any]:
            return {"data": [{"id": BASE}, *({"id": name} for name in sorted(self.loaded))]}

        @app.post("/v1/load_lora_adapter")
        async def load(body: dict[str, Any]) -> str:
            self.loaded.add(body["lora_name"])
            return "ok"

        @app.post("/v1/unload_lora_adapter")
        async def unload(body: dict[str, Any]) -> str:
            self.loaded.discard(body["lora_name"])
            return "ok"

        return app


@pytest.fixture
def servers() -> list[Adapters]:
    return [Adapters(), Adapters()]


@pytest.fixture
def urls(servers: list[Adapters]) -> Iterator[list[str]]:
    with ExitStack() as stack:
        yield [stack.enter_context(serving(server)) for server in servers]
    JOBS_ON.clear()


def job(urls: list[str], folder: str) -> VLLMServer:
    once = Backoff(initial=0.01, cap=0.01, attempts=1)
    return VLLMServer(urls[0], BASE, backoff=once, folder=Path("/jobs") / folder, tier=urls)


async def test_each_job_samples_on_the_server_with_fewest_jobs(servers, urls):
    first, second, third = job(urls, "job-1"), job(urls, "job-2"), job(urls, "job-3")
    assert [first.url, second.url, third.url] == [urls[0], urls[1], urls[0]]
    await second.load(0, "/jobs/job-2/v0", keep=set())
    assert len(servers[1].loaded) == 1
    assert not servers[0].loaded
    await second.aclose()  # its place is free again: the next job goes there
    fourth = job(urls, "job-4")
    assert fourth.url == urls[1] and not servers[1].loaded
    for other in (first, third, fourth):
        await other.aclose()
    assert sum(JOBS_ON.values()) == 0


async def test_a_resumed_attempt_clears_what_an_earlier_left_on_any_server(servers, urls):
    JOBS_ON[urls[0]] += 5  # the first is busy: the earlier attempt samples on the second
    earlier = job(urls, "job-7")
    assert earlier.url == urls[1]
    await earlier.load(3, "/jobs/job-7/v3", keep=set())
    left = set(servers[1].loaded)
    JOBS_ON.clear()  # the worker died; another takes the job up

    later = job(urls, "job-7")
    assert later.url == urls[0]
    assert set(await later.unload_earlier_attempts()) == left and not servers[1].loaded
    await later.aclose()


def test_replicas_stand_beside_a_named_server(monkeypatch):
    monkeypatch.setenv("OPD_VLLM_SERVERS", f'{{"{BASE}": "http://a:8001/v1"}}')
    monkeypatch.setenv("OPD_VLLM_REPLICAS", f'{{"{BASE}": ["http://b:8001/v1/"]}}')
    assert Settings().vllm_tiers() == {BASE: ["http://a:8001/v1", "http://b:8001/v1"]}
    monkeypatch.setenv("OPD_VLLM_REPLICAS", '{"other": ["http://b:8001/v1"]}')
    with pytest.raises(ValueError, match="other is not in OPD_VLLM_SERVERS"):
        Settings()
