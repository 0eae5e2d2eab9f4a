"""What the job store refuses, each a different answer for the API or the worker."""

from __future__ import annotations

import json
from typing import Any


class JobNotFound(LookupError):
    """No job with this id (or none the caller may see)."""


class IllegalTransition(Exception):
    """The job's current status does not allow the change; the message says why."""


class IdempotencyMismatch(ValueError):
    """An Idempotency-Key was reused with a different request body."""


class JobNotHeld(Exception):
    """The worker no longer holds this job: another worker took it over, or it ended."""


class SweepNotFound(LookupError):
    """No sweep with this id (or none the caller may see)."""


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
