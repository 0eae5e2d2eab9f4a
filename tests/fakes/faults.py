"""Faults injected into a fake service's methods, for tests of what the worker does then."""

from __future__ import annotations

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
