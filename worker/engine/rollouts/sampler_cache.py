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

A job that samples on vLLM (`sampling.engine: vllm`) asks for its checkpoints' samplers on
the server the worker has for that base model (`served`): each its adapter loaded there.
Those weigh nothing here, count as entries, and are unloaded from the server once evicted
and no request holds them (`using`). A worker with no server for the base model samples
them with the local engine: the same weights.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter, OrderedDict
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Protocol

from kernel.errors import OPDError
from kernel.spec import JobSpec
from worker.engine.backends import footprint
from worker.engine.backends.contract import SamplingClient, ServiceClient

Connect = Callable[[JobSpec], ServiceClient]
MIB = 1024 * 1024
log = logging.getLogger(__name__)


class Served(Protocol):
    """Samplers on the inference servers a worker is given, by base model (vLLM's)."""

    def url(self, base_model: str) -> str | None:
        """The server for `base_model`, or None: this worker has none."""

    async def open(self, base_model: str, weights: str) -> SamplingClient:
        """A sampler of `weights` (saved weights of `base_model`) loaded into its server."""

    async def close(self, client: SamplingClient) -> None:
        """Unload what `open` loaded for `client`."""

    async def aclose(self) -> None:
        """Unload everything opened, and close the connections."""


@dataclass(frozen=True)
class SamplerKey:
    service: str
    """The backend and its options (`service_key`)."""
    base_model: str
    weights: str | None
    served: bool = False
    """On the server `served` names for the base model (`service` is its URL)."""

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
    served: bool


def service_key(spec: JobSpec) -> str:
    """One backend connection serves every spec with the same backend and options."""
    options = getattr(spec, spec.backend)
    return f"{spec.backend}:{options.model_dump_json()}"


class SamplerCache:
    def __init__(
        self, connect: Connect, max_entries: int, max_bytes: int, served: Served | None = None
    ) -> None:
        self.connect = connect
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.served = served
        self.holds: Counter[SamplingClient] = Counter()
        """Requests using each sampler now (`using`)."""
        self.retired: set[SamplingClient] = set()
        """Served samplers evicted while held: closed when the last request lets go."""
        self.closing: set[asyncio.Task[None]] = set()
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

    async def get(
        self, spec: JobSpec, base_model: str, weights: str | None, on_vllm: bool = False
    ) -> Loaded:
        """A sampler of `base_model` with `weights` (None: the base model itself); saved
        weights `on_vllm`, on this worker's server for the base model if it has one. The
        request holds it until `let_go`."""
        served = on_vllm and weights is not None and self.served is not None
        url = self.served.url(base_model) if served and self.served is not None else None
        key = SamplerKey(service_key(spec) if url is None else url, base_model, weights, bool(url))
        if (entry := self.entries.get(key)) is not None:
            self.entries.move_to_end(key)
            self.holds[entry.client] += 1
            return Loaded(entry.client, cached=True)
        loading = self.loading.get(key)
        if loading is None:
            loading = self.loading[key] = asyncio.ensure_future(self.load(key, spec))
            loading.add_done_callback(lambda done: self.finished(key, done))
        # A request that gives up (its deadline) lets the load finish for the next one.
        client = await asyncio.shield(loading)
        self.holds[client] += 1
        return Loaded(client, cached=False)

    @asynccontextmanager
    async def using(
        self, spec: JobSpec, asked: Sequence[tuple[str, str | None, bool]]
    ) -> AsyncIterator[list[Loaded]]:
        """The samplers `asked` (base model, weights, on vLLM), loaded at once and held
        while the block runs, let go after it however it ends (those loaded before a
        failure or a deadline too)."""
        gets = [asyncio.ensure_future(self.get(spec, *one)) for one in asked]
        try:
            yield list(await asyncio.gather(*gets))
        finally:
            for get in gets:
                get.cancel()
            self.let_go(
                [
                    get.result()
                    for get in gets
                    if get.done() and not get.cancelled() and not get.exception()
                ]
            )

    def let_go(self, loaded: Sequence[Loaded]) -> None:
        """A request is done with the samplers `get` gave it: one evicted meanwhile is
        closed once no other request holds it."""
        for one in loaded:
            self.holds[one.client] -= 1
            if self.holds[one.client] <= 0:
                del self.holds[one.client]
                if one.client in self.retired:
                    self.retired.discard(one.client)
                    self.close(one.client)

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
            if key.served:
                assert self.served is not None and key.weights is not None
                client = await self.served.open(key.base_model, key.weights)
            else:
                service = await self.service(key, spec)
                client = await service.create_sampling_client_async(
                    base_model=key.base_model, model_path=key.weights
                )
            size = self.sizes[key.model] = footprint(client)
            if size > self.max_bytes:
                raise self.too_large(key, size)
            kept = Entry(client, size, key.served)
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
            _, entry = self.entries.popitem(last=False)
            if entry.served and self.holds[entry.client] > 0:
                self.retired.add(entry.client)
            elif entry.served:
                self.close(entry.client)

    def close(self, client: SamplingClient) -> None:
        """Unload a served sampler from its server, in the background (a failure is logged:
        the server unloads it when it restarts)."""
        assert self.served is not None
        task = asyncio.ensure_future(self.served.close(client))
        self.closing.add(task)
        task.add_done_callback(self.closed)

    def closed(self, task: asyncio.Task[None]) -> None:
        self.closing.discard(task)
        if not task.cancelled() and (error := task.exception()) is not None:
            log.warning("could not unload a playground adapter: %s", error)

    async def aclose(self) -> None:
        """Unload what the servers hold for this cache (the worker stops)."""
        await asyncio.gather(*self.closing, return_exceptions=True)
        if self.served is not None:
            await self.served.aclose()

    def too_large(self, key: SamplerKey, size: int) -> OPDError:
        return OPDError(
            f"{key.base_model} takes {size / MIB:,.1f} MiB, more than a worker may hold for "
            f"the playground (OPD_SAMPLER_CACHE_MB = {self.max_bytes / MIB:,.1f})",
            code="model_too_large",
        )
