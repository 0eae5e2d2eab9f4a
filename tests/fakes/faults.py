"""Faults injected into a fake service's methods, for tests of what the worker does then
(or what a request does while one is slow)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest


def fail_first(
    monkeypatch: pytest.MonkeyPatch, cls: type, method: str, *errors: Exception
) -> list[Exception]:
    """`cls.method` (async) raises `errors` in turn, then works; what is left is returned."""
    pending = list(errors)
    original = getattr(cls, method)

    async def flaky(self: Any, *args: Any, **kwargs: Any) -> Any:
        if pending:
            raise pending.pop(0)
        return await original(self, *args, **kwargs)

    monkeypatch.setattr(cls, method, flaky)
    return pending


@dataclass
class Held:
    """A call held on its way in: `entered` is set once it began, and it goes on once
    `release` is set."""

    entered: asyncio.Event = field(default_factory=asyncio.Event)
    release: asyncio.Event = field(default_factory=asyncio.Event)


def hold_first(monkeypatch: pytest.MonkeyPatch, cls: type, method: str) -> Held:
    """`cls.method` (async): its first call waits for `release` (a slow backend, for what
    arrives meanwhile); later calls go straight through."""
    held = Held()
    original = getattr(cls, method)

    async def slow(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not held.entered.is_set():
            held.entered.set()
            await held.release.wait()
        return await original(self, *args, **kwargs)

    monkeypatch.setattr(cls, method, slow)
    return held
