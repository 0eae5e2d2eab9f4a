"""JSON documents the database keeps (specs, definitions), bounded in size."""

from __future__ import annotations

import json
from typing import Any


class TooLargeToStore(ValueError):
    """A spec or sweep definition larger as JSON than the service stores (max_spec_bytes)."""


def stored_json(document: dict[str, Any], what: str, max_bytes: int) -> dict[str, Any]:
    """`document` as a JSON column stores it, if it fits in `max_bytes`; else TooLargeToStore."""
    size = len(json.dumps(document))
    if size > max_bytes:
        raise TooLargeToStore(
            f"{what} is {size:,} bytes as JSON, more than this service stores ({max_bytes:,}, "
            "OPD_MAX_SPEC_BYTES); read long prompt lists from a dataset file"
        )
    return document
