"""A worker's recently used sampling clients, in a small cache with a memory bound.

Opening a sampler costs seconds (the local backend loads a model and merges the LoRA into
it; a remote one opens a sampling session for saved weights), and people try the same few
checkpoints again and again. Clients are kept in least-recently-used order and evicted
past `max_entries`, or past `max_bytes` of what they hold in this process (a local model's
tensors; a remote client weighs next to nothing).

The bounds cover what loads as well as what is kept. A model's size is known once a
sampler of its base model has loaded here: a load of a known size first reserves room for
it beside the loads in flight (waiting while they leave none) and evicts the least
recently used to make it, so kept and loading together stay within both bounds. A model
never loaded yet loads alone (no other load of weight in flight); the ones kept are
trimmed once it has loaded, so only that first load may briefly hold one model more. A
request still using a sampler that was evicted holds it until it ends. A model larger
than `max_bytes` is a clear error (`model_too_large`), found by its one load and then known
without loading again. Concurrent requests for one model wait for one load. Backends are
connected once per backend and options.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from kernel.errors import OPDError
from kernel.spec import JobSpec
from worker.engine.backends import footprint
from worker.engine.backends.contract import SamplingClient, ServiceClient

Connect = Callable[[JobSpec], ServiceClient]
MIB = 1024 * 1024


@dataclass(frozen=True)
class SamplerKey:
    service: str
    """The backend and its options (`service_key`)."""
    base_model: str
    weights: str | None

    @property
    def model(self) -> tuple[str, str]:
        """What a sampler's size depends on: its base model (saved weights of one base
        model, LoRA merged in, weigh alike) on its backend."""
        return self.service, self.base_model


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
        self.sizes: dict[tuple[str, str], int] = {}
        """The bytes a sampler of each model took when one was last loaded."""
        self.reserved = 0
        """Bytes the loads in flight may take."""
        self.reservations = 0
        """Loads in flight."""
        self.room_freed = asyncio.Event()
        """Set (and replaced) whenever a load ends: the ones waiting for room look again."""

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
        estimate = await self.reserve(key)
        kept = None
        try:
            service = await self.service(key, spec)
            client = await service.create_sampling_client_async(
                base_model=key.base_model, model_path=key.weights
            )
            size = self.sizes[key.model] = footprint(client)
            if size > self.max_bytes:
                raise self.too_large(key, size)
            kept = Entry(client, size)
            return client
        finally:
            self.release(estimate, key, kept)

    async def reserve(self, key: SamplerKey) -> int:
        """Room for a sampler of `key`'s model beside the loads in flight (waiting while
        they leave none; a load that ends meanwhile may tell its size), made by evicting
        the least recently used; a model never loaded reserves the whole bound (it loads
        alone) and is weighed once loaded. Returns the bytes reserved."""
        while True:
            known = self.sizes.get(key.model)
            if known is not None and known > self.max_bytes:
                raise self.too_large(key, known)
            estimate = self.max_bytes if known is None else known
            if self.reservations < self.max_entries and self.reserved + estimate <= self.max_bytes:
                break
            await self.room_freed.wait()
        self.reservations += 1
        self.reserved += estimate
        if known is not None:
            self.evict()
        return estimate

    def release(self, estimate: int, key: SamplerKey, kept: Entry | None) -> None:
        """A load ended: its room goes to what it loaded (if it is kept), the rest is free."""
        self.reservations -= 1
        self.reserved -= estimate
        if kept is not None:
            self.entries[key] = kept
        self.evict()
        self.room_freed.set()
        self.room_freed = asyncio.Event()

    def evict(self) -> None:
        """Drop the least recently used until what is kept and what loads fit the bounds."""
        while self.entries and (
            len(self.entries) + self.reservations > self.max_entries
            or self.size + self.reserved > self.max_bytes
        ):
            self.entries.popitem(last=False)

    def too_large(self, key: SamplerKey, size: int) -> OPDError:
        return OPDError(
            f"{key.base_model} takes {size / MIB:,.1f} MiB, more than a worker may hold for "
            f"the playground (OPD_SAMPLER_CACHE_MB = {self.max_bytes / MIB:,.1f})",
            code="model_too_large",
        )
