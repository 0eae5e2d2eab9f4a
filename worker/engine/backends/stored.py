"""The local backend with its checkpoints in a bucket (kernel/storage/checkpoints.py).

A wrapper of the backend's clients: a save writes the folder as before, then uploads it,
and answers with the stored checkpoint's name only once every object is in the store, so
the sink records nothing that is not whole. A load of a stored name (resume, init_from, a
teacher's weights, sampler weights a pipelined run samples from, the playground) first
fetches the checkpoint into this worker's bounded cache. Other calls pass through.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from kernel.storage.checkpoints import CheckpointStore
from worker.engine.backends.contract import SamplingClient

R = TypeVar("R")


class StoredCheckpoints:
    """Stored names <-> local folders for one service: what this process uploaded is read
    from where it was written, anything else from the cache."""

    def __init__(self, store: CheckpointStore) -> None:
        self.store = store
        self.written: dict[str, str] = {}

    async def local(self, path: str) -> str:
        if (folder := self.written.get(path)) is not None and Path(folder).is_dir():
            return folder
        return await asyncio.to_thread(self.store.local, path)

    async def uploaded(self, saving: Awaitable[Any], kind: str, name: str) -> Any:
        """The backend's answer to a save, its path the stored checkpoint's name."""
        saved = await saving
        stored = await self.store.upload(Path(saved.path), kind, name)
        self.written[stored] = saved.path
        return saved.model_copy(update={"path": stored})


class StoredTraining:
    """A training client whose checkpoints go through the store."""

    def __init__(self, inner: Any, checkpoints: StoredCheckpoints) -> None:
        self.inner = inner
        self.checkpoints = checkpoints

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def save_state_async(self, name: str) -> Awaitable[Any]:
        return self.checkpoints.uploaded(await self.inner.save_state_async(name), "state", name)

    async def save_weights_for_sampler_async(self, name: str) -> Awaitable[Any]:
        saving = await self.inner.save_weights_for_sampler_async(name)
        return self.checkpoints.uploaded(saving, "sampler", name)

    async def load_state_with_optimizer_async(self, path: str) -> Awaitable[Any]:
        return await self.loaded(self.inner.load_state_with_optimizer_async, path)

    async def load_state_async(self, path: str) -> Awaitable[Any]:
        return await self.loaded(self.inner.load_state_async, path)

    async def create_sampling_client_async(self, model_path: str) -> SamplingClient:
        return await self.loaded(self.inner.create_sampling_client_async, model_path)

    async def loaded(self, load: Callable[[str], Awaitable[R]], path: str) -> R:
        return await load(await self.checkpoints.local(path))


class StoredService:
    """A service client whose training clients' checkpoints, and whose samplers' weights,
    go through the store."""

    def __init__(self, inner: Any, store: CheckpointStore) -> None:
        self.inner = inner
        self.checkpoints = StoredCheckpoints(store)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def create_lora_training_client_async(
        self, base_model: str, rank: int = 32, seed: int | None = None
    ) -> StoredTraining:
        training = await self.inner.create_lora_training_client_async(
            base_model=base_model, rank=rank, seed=seed
        )
        return StoredTraining(training, self.checkpoints)

    async def create_sampling_client_async(
        self, base_model: str, model_path: str | None = None
    ) -> SamplingClient:
        if model_path is not None:
            model_path = await self.checkpoints.local(model_path)
        return await self.inner.create_sampling_client_async(
            base_model=base_model, model_path=model_path
        )
