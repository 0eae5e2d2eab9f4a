"""A worker's recently used sampling clients, in a small cache with a memory bound.

Opening a sampler costs seconds (the local backend loads a model and merges the LoRA into
it; a remote one opens a sampling session for saved weights), and people try the same few
checkpoints again and again. Clients are kept in least-recently-used order and evicted
past `max_entries`, or past `max_bytes` of what they hold in this process (a local model's
tensors; a remote client weighs next to nothing). A client that alone weighs more than
`max_bytes` serves its request and is not kept. While a new client loads, the ones kept
stay, so memory may briefly hold one model more. Concurrent requests for one model wait
for one load. Backends are connected once per backend and options.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from kernel.spec import JobSpec
from worker.engine.backends import footprint
from worker.engine.backends.contract import SamplingClient, ServiceClient

Connect = Callable[[JobSpec], ServiceClient]


@dataclass(frozen=True)
class SamplerKey:
    service: str
    """The backend and its options (`service_key`)."""
    base_model: str
    weights: str | None


@dataclass(frozen=True)
class Loaded:
    client: SamplingClient
    cached: bool
    """It was loaded before this request asked."""


@dataclass(frozen=True)
class Entry:
    client: SamplingClient
    size: int


def service_key(spec: JobSpec) -> str:
    """One backend connection serves every spec with the same backend and options."""
    options = getattr(spec, spec.backend)
    return f"{spec.backend}:{options.model_dump_json()}"


class SamplerCache:
    def __init__(self, connect: Connect, max_entries: int, max_bytes: int) -> None:
        self.connect = connect
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.services: dict[str, asyncio.Future[ServiceClient]] = {}
        self.entries: OrderedDict[SamplerKey, Entry] = OrderedDict()
        self.loading: dict[SamplerKey, asyncio.Future[SamplingClient]] = {}

    @property
    def size(self) -> int:
        return sum(entry.size for entry in self.entries.values())

    async def get(self, spec: JobSpec, base_model: str, weights: str | None) -> Loaded:
        """A sampler of `base_model` with `weights` (None: the base model itself)."""
        key = SamplerKey(service_key(spec), base_model, weights)
        if (entry := self.entries.get(key)) is not None:
            self.entries.move_to_end(key)
            return Loaded(entry.client, cached=True)
        loading = self.loading.get(key)
        if loading is None:
            loading = self.loading[key] = asyncio.ensure_future(self.load(key, spec))
            loading.add_done_callback(lambda done: self.finished(key, done))
        # A request that gives up (its deadline) lets the load finish for the next one.
        return Loaded(await asyncio.shield(loading), cached=False)

    def finished(self, key: SamplerKey, done: asyncio.Future[SamplingClient]) -> None:
        self.loading.pop(key, None)
        if not done.cancelled():
            done.exception()  # retrieved, so an unawaited failure is not logged as lost

    async def service(self, key: SamplerKey, spec: JobSpec) -> ServiceClient:
        """The backend's one connection (a local one runs every model on one thread)."""
        connecting = self.services.get(key.service)
        if connecting is None:
            connecting = asyncio.ensure_future(asyncio.to_thread(self.connect, spec))
            connecting.add_done_callback(lambda done: self.connected(key.service, done))
            self.services[key.service] = connecting
        return await asyncio.shield(connecting)

    def connected(self, name: str, done: asyncio.Future[ServiceClient]) -> None:
        """A failed connection is forgotten, so the next request tries again."""
        if done.cancelled() or done.exception() is not None:
            self.services.pop(name, None)

    async def load(self, key: SamplerKey, spec: JobSpec) -> SamplingClient:
        service = await self.service(key, spec)
        client = await service.create_sampling_client_async(
            base_model=key.base_model, model_path=key.weights
        )
        self.keep(key, client, footprint(client))
        return client

    def keep(self, key: SamplerKey, client: SamplingClient, size: int) -> None:
        if size > self.max_bytes:
            return
        self.entries[key] = Entry(client, size)
        while len(self.entries) > self.max_entries or self.size > self.max_bytes:
            self.entries.popitem(last=False)
