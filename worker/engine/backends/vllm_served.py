"""The playground's samplers on vLLM, for a job whose student samples there
(`sampling.engine: vllm`): a checkpoint as its adapter (the PEFT LoRA folder the local
backend's sampler loads) loaded into the server for its base model under a name of this
worker's, that folder's and that load's (`opd-play-<worker>-<hash of the path>-<n>`),
unloaded when the playground's cache lets it go (`SamplerCache`) and when the worker stops.

Only adapters: vLLM's CPU build (0.32.0) gives a base-model request wrong logprobs (off by
1.0, measured) when one engine step also holds an adapter's, so the base model stays with
the local engine.

A person is waiting: a server away is tried for seconds, not the minute a job allows.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import logging
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from kernel.errors import BackendRejected, BackendUnavailable
from kernel.retry import Backoff
from worker.engine.backends.contract import SamplingClient
from worker.engine.backends.vllm import VLLMSampler, VLLMServer

log = logging.getLogger(__name__)
RETRY = Backoff(initial=0.5, cap=2.0, attempts=3)
PREFIX = "opd-play-"


def logged(message: str, data: dict[str, Any]) -> None:
    """A retry of a playground request: the worker's log hears of it."""
    log.warning("%s", message)


class ServedSamplers:
    """The vLLM servers a worker is given (OPD_VLLM_SERVERS: base model -> URL), with
    `tokenizer` the student's tokenizer of a base model and `folder` the local folder of a
    checkpoint's path (a stored one fetched first); the server must read that folder."""

    def __init__(
        self,
        urls: Mapping[str, str],
        tokenizer: Callable[[str], Any],
        folder: Callable[[str], str],
    ) -> None:
        self.urls = dict(urls)
        self.tokenizer, self.folder = tokenizer, folder
        self.servers: dict[str, VLLMServer] = {}
        self.tokenizers: dict[str, Any] = {}
        self.adapters: dict[str, VLLMServer] = {}
        """The server each adapter loaded by this worker is on, by its name there."""
        self.worker = uuid.uuid4().hex[:8]
        self.loads = itertools.count()

    def url(self, base_model: str) -> str | None:
        return self.urls.get(base_model)

    def server(self, base_model: str) -> VLLMServer:
        if base_model not in self.servers:
            url = self.urls[base_model]
            self.servers[base_model] = VLLMServer(url, base_model, logged, RETRY)
        return self.servers[base_model]

    async def open(self, base_model: str, weights: str) -> VLLMSampler:
        """The adapter saved at `weights`, loaded into the server for its base model."""
        server = self.server(base_model)
        if base_model not in self.tokenizers:
            self.tokenizers[base_model] = await asyncio.to_thread(self.tokenizer, base_model)
        tokenizer = self.tokenizers[base_model]
        folder = str(Path(await asyncio.to_thread(self.folder, weights)).resolve())
        digest = hashlib.sha256(weights.encode()).hexdigest()[:12]
        name = f"{PREFIX}{self.worker}-{digest}-{next(self.loads)}"
        await server.post("/load_lora_adapter", {"lora_name": name, "lora_path": folder})
        self.adapters[name] = server
        return VLLMSampler(server, name, tokenizer)

    async def close(self, client: SamplingClient) -> None:
        """Unload the adapter `open` loaded for `client`."""
        if isinstance(client, VLLMSampler) and client.model in self.adapters:
            server = self.adapters.pop(client.model)
            await server.post("/unload_lora_adapter", {"lora_name": client.model})

    async def aclose(self) -> None:
        """Unload every adapter still loaded, once each (a server gone keeps them until it
        restarts), and close the connections."""
        for name, server in list(self.adapters.items()):
            try:
                await server.send_once("/unload_lora_adapter", {"lora_name": name})
            except (BackendUnavailable, BackendRejected) as error:
                log.warning("could not unload %s: %s", name, error)
        self.adapters.clear()
        for server in self.servers.values():
            await server.aclose()
