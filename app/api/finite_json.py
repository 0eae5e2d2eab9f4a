"""JSON has no NaN or Infinity, but Python's json reads them: a body that holds one would
reach an untyped field (a sweep's `base`, a merge patch) and then a JSON column, which
Postgres refuses. The API refuses such a body before any route reads it."""

from __future__ import annotations

import json
import math
import re
from typing import Any

NON_FINITE = re.compile(rb"NaN|Infinity")


def non_finite_field(body: bytes) -> str | None:
    """The dotted path of the first NaN or Infinity in a JSON body ("body" at its root),
    or None; a body that does not parse is left to the route to refuse."""
    if NON_FINITE.search(body) is None:
        return None
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return None
    pending: list[tuple[Any, list[str]]] = [(data, [])]
    while pending:
        value, path = pending.pop()
        if isinstance(value, float) and not math.isfinite(value):
            return ".".join(path) or "body"
        if isinstance(value, dict):
            items = list(value.items())
        elif isinstance(value, list):
            items = list(enumerate(value))
        else:
            continue
        pending.extend((item, [*path, str(key)]) for key, item in reversed(items))
    return None
