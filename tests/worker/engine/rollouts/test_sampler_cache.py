"""The playground's cache of sampling clients, on the local backend's tiny models: most
recently used first, within its count and its memory bound (loads in flight included),
one load per model however many ask at once, a model over the bound a clear error after
one load, and a failed load is not kept."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from kernel.errors import OPDError
from kernel.spec import JobSpec
from tests.support import named
from worker.engine.backends import connect
from worker.engine.backends.contract import ServiceClient
from worker.engine.backends.local import LocalServiceClient
from worker.engine.rollouts.sampler_cache import SamplerCache

SPEC = JobSpec.model_validate(named({"backend": "local", "local": {"device": "cpu"}}))
STUDENT, TEACHER = "tiny-student", "tiny-teacher"


class Counting:
    """The local backend, counting the samplers it is asked to make, and the most it was
    making at once."""

    def __init__(self, service: ServiceClient) -> None:
        self.service = service
        self.made: list[tuple[str, str | None]] = []
        self.making = self.most_at_once = 0

    async def create_sampling_client_async(self, base_model: str, model_path: str | None) -> Any:
        self.made.append((base_model, model_path))
        self.making += 1
        self.most_at_once = max(self.most_at_once, self.making)
        try:
            return await self.service.create_sampling_client_async(
                base_model, model_path=model_path
            )
        finally:
            self.making -= 1


@pytest.fixture
def backend(tmp_path: Path) -> Counting:
    return Counting(connect(SPEC, tmp_path, lambda *_: None))


@pytest.fixture
async def saved(tmp_path: Path) -> list[str]:
    """Two sets of the student's sampler weights: two more samplers of the student's size."""
    service = LocalServiceClient(SPEC.local, tmp_path / "saved")
    trainer = await service.create_lora_training_client_async(STUDENT, rank=4, seed=1)
    return [(await (await trainer.save_weights_for_sampler_async(n))).path for n in ("a", "b")]


def cache(backend: Counting, entries: int = 4, megabytes: float = 1024) -> SamplerCache:
    return SamplerCache(lambda spec: backend, entries, int(megabytes * 2**20))  # type: ignore[arg-type,return-value]


async def test_the_least_recently_used_sampler_goes_first(backend, saved):
    samplers = cache(backend, entries=2)
    first, second = saved
    await samplers.get(SPEC, STUDENT, None)
    await samplers.get(SPEC, STUDENT, first)
    assert (await samplers.get(SPEC, STUDENT, None)).cached  # now the most recent
    await samplers.get(SPEC, STUDENT, second)

    assert (await samplers.get(SPEC, STUDENT, None)).cached
    assert not (await samplers.get(SPEC, STUDENT, first)).cached
    assert len(samplers.entries) == 2


async def test_the_memory_bound_holds_for_what_is_kept_and_what_loads(backend, saved):
    weigh = cache(backend)
    await weigh.get(SPEC, STUDENT, None)
    one = weigh.size
    assert one > 0  # a local model weighs its tensors

    bounded = cache(backend, megabytes=1.5 * one / 2**20)
    await bounded.get(SPEC, STUDENT, None)
    await bounded.get(SPEC, STUDENT, saved[0])
    assert bounded.size <= 1.5 * one and len(bounded.entries) == 1
    assert not (await bounded.get(SPEC, STUDENT, None)).cached

    backend.most_at_once = 0
    await asyncio.gather(*(bounded.get(SPEC, STUDENT, path) for path in saved))
    assert backend.most_at_once == 1, "room for one: the second load waits for the first"
    assert bounded.size <= 1.5 * one

    roomy = cache(backend, megabytes=2.5 * one / 2**20)
    await roomy.get(SPEC, STUDENT, None)
    backend.most_at_once = 0
    await asyncio.gather(*(roomy.get(SPEC, STUDENT, path) for path in saved))
    assert backend.most_at_once == 2 and roomy.size <= 2.5 * one


async def test_models_never_loaded_load_one_at_a_time(backend):
    """Their size is not known before they load: each may take the whole bound."""
    samplers = cache(backend)
    await asyncio.gather(samplers.get(SPEC, STUDENT, None), samplers.get(SPEC, TEACHER, None))
    assert backend.most_at_once == 1 and len(backend.made) == 2


async def test_a_model_over_the_bound_is_a_clear_error_after_one_load(backend, saved):
    """Requests at once for it, with its base weights or saved ones, share that load."""
    weigh = cache(backend)
    await weigh.get(SPEC, STUDENT, None)
    one = weigh.size
    tiny = cache(backend, megabytes=0.5 * one / 2**20)
    loads = len(backend.made)

    asked = await asyncio.gather(
        *(tiny.get(SPEC, STUDENT, weights) for weights in [None, None, *saved]),
        return_exceptions=True,
    )
    again = await asyncio.gather(tiny.get(SPEC, STUDENT, None), return_exceptions=True)

    for refused in [*asked, *again]:
        assert isinstance(refused, OPDError) and refused.code == "model_too_large"
        assert "OPD_SAMPLER_CACHE_MB" in str(refused) and STUDENT in str(refused)
    assert len(backend.made) == loads + 1, "one load for every request, then none"
    assert tiny.size == 0 and not tiny.loading


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


class OnAServer:
    """The student's samplers on a server (`Served`), the local backend's standing in for
    vLLM's: what was opened and what closed."""

    def __init__(self, service: ServiceClient) -> None:
        self.service = service
        self.opened: list[tuple[str, str | None]] = []
        self.closed: list[Any] = []

    def url(self, base_model: str) -> str | None:
        return "http://vllm.test/v1" if base_model == STUDENT else None

    async def open(self, base_model: str, weights: str) -> Any:
        self.opened.append((base_model, weights))
        return await self.service.create_sampling_client_async(base_model, model_path=weights)

    async def close(self, client: Any) -> None:
        self.closed.append(client)

    async def aclose(self) -> None:
        pass


async def test_a_job_on_vllm_samples_its_student_on_the_server_and_evicted_is_unloaded(
    backend, saved, tmp_path
):
    """On vLLM, a checkpoint's sampler comes from its server, the teacher's and the base
    model's from the backend; a served sampler evicted while a request holds it is unloaded
    once it lets go, one nobody holds at once."""
    server = OnAServer(connect(SPEC, tmp_path / "server", lambda *_: None))
    samplers = SamplerCache(lambda spec: backend, 3, 2**30, server)  # type: ignore[arg-type,return-value]
    first, second = saved

    asked = [(STUDENT, first, True), (TEACHER, None, True), (STUDENT, None, True)]
    async with samplers.using(SPEC, asked) as held:
        assert server.opened == [(STUDENT, first)], "saved weights of the served base model"
        assert backend.made == [(TEACHER, None), (STUDENT, None)]
        async with samplers.using(SPEC, [(STUDENT, second, True)]) as (later,):
            assert len(samplers.entries) == 3 and not server.closed, "evicted, still held"
        await asyncio.sleep(0)
        assert not server.closed
    await asyncio.sleep(0)
    assert server.closed == [held[0].client], "let go: unloaded"

    for recent in (TEACHER, STUDENT):
        await samplers.get(SPEC, recent, None, on_vllm=True)
    await samplers.get(SPEC, STUDENT, first)  # not on vLLM: the backend's; evicts `later`
    await asyncio.sleep(0)
    assert backend.made[-1] == (STUDENT, first)
    assert server.closed == [held[0].client, later.client], "nobody held it: unloaded at once"
