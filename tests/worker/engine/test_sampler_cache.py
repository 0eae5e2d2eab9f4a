"""The playground's cache of sampling clients, on the local backend's tiny models: most
recently used first, within its count and its memory bound, one load per model however
many ask at once, and a failed load is not kept."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from kernel.errors import OPDError
from kernel.spec import JobSpec
from worker.engine.backends import connect
from worker.engine.backends.contract import ServiceClient
from worker.engine.sampler_cache import SamplerCache

SPEC = JobSpec.model_validate({"backend": "local", "local": {"device": "cpu"}})
STUDENT, TEACHER = "tiny-student", "tiny-teacher"


class Counting:
    """The local backend, counting the samplers it is asked to make."""

    def __init__(self, service: ServiceClient) -> None:
        self.service = service
        self.made: list[tuple[str, str | None]] = []

    async def create_sampling_client_async(self, base_model: str, model_path: str | None) -> Any:
        self.made.append((base_model, model_path))
        return await self.service.create_sampling_client_async(base_model, model_path=model_path)


@pytest.fixture
def backend(tmp_path: Path) -> Counting:
    return Counting(connect(SPEC, tmp_path, lambda *_: None))


def cache(backend: Counting, entries: int = 4, megabytes: float = 1024) -> SamplerCache:
    return SamplerCache(lambda spec: backend, entries, int(megabytes * 2**20))  # type: ignore[arg-type,return-value]


async def test_the_least_recently_used_sampler_goes_first(backend):
    samplers = cache(backend, entries=2)
    await samplers.get(SPEC, STUDENT, None)
    await samplers.get(SPEC, TEACHER, None)
    assert (await samplers.get(SPEC, STUDENT, None)).cached  # now the most recent
    third = SPEC.model_copy(update={"local": SPEC.local.model_copy(update={"cpu_threads": 2})})
    await samplers.get(third, STUDENT, None)  # another backend option: another sampler

    assert (await samplers.get(SPEC, STUDENT, None)).cached
    assert not (await samplers.get(SPEC, TEACHER, None)).cached
    assert len(samplers.entries) == 2


async def test_the_memory_bound_holds_and_a_sampler_over_it_is_not_kept(backend):
    weigh = cache(backend)
    await weigh.get(SPEC, STUDENT, None)
    one = weigh.size
    assert one > 0  # a local model weighs its tensors

    bounded = cache(backend, megabytes=1.5 * one / 2**20)
    await bounded.get(SPEC, STUDENT, None)
    await bounded.get(SPEC, TEACHER, None)
    assert bounded.size <= 1.5 * one and len(bounded.entries) == 1
    assert not (await bounded.get(SPEC, STUDENT, None)).cached

    tiny = cache(backend, megabytes=0.5 * one / 2**20)
    assert not (await tiny.get(SPEC, STUDENT, None)).cached
    assert not (await tiny.get(SPEC, STUDENT, None)).cached
    assert tiny.size == 0


async def test_requests_at_once_for_one_model_load_it_once(backend):
    samplers = cache(backend)
    first, second = await asyncio.gather(
        samplers.get(SPEC, TEACHER, None), samplers.get(SPEC, TEACHER, None)
    )
    assert first.client is second.client
    assert backend.made == [(TEACHER, None)]


async def test_a_failed_load_is_not_kept(backend, tmp_path):
    samplers = cache(backend)
    for _ in range(2):
        with pytest.raises(OPDError) as caught:
            await samplers.get(SPEC, STUDENT, str(tmp_path / "missing"))
        assert caught.value.code == "bad_checkpoint"
    assert len(backend.made) == 2 and not samplers.entries and not samplers.loading
