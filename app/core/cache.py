"""A small per-process cache whose entries expire, for reads that many clients repeat."""

from __future__ import annotations

import time
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class TTLCache(Generic[K, V]):
    """Entries live `ttl` seconds (0 = nothing is kept); when full, it starts afresh."""

    def __init__(self, ttl: float, max_size: int = 10_000) -> None:
        self.ttl = ttl
        self.max_size = max_size
        self._entries: dict[K, tuple[float, V]] = {}

    def get(self, key: K) -> V | None:
        entry = self._entries.get(key)
        if entry is None or entry[0] < time.monotonic():
            return None
        return entry[1]

    def put(self, key: K, value: V) -> None:
        if self.ttl <= 0:
            return
        if len(self._entries) >= self.max_size:
            self._entries.clear()
        self._entries[key] = (time.monotonic() + self.ttl, value)

    def drop(self, key: K) -> None:
        self._entries.pop(key, None)
