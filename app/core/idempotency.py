"""An Idempotency-Key and the request it came with: a request sent again with the same key
(a retry after a lost answer) is answered with what the first made, and the same key with
another request is refused. Jobs, playground samples and file uploads keep one per team."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Idempotency:
    """An Idempotency-Key and the request it came with, as its client sent it (the route
    and its parsed JSON body, not the spec made of it): a retry is the same request
    whatever defaults the spec gained since."""

    key: str
    route: str
    body: Any

    @property
    def fingerprint(self) -> str:
        """A digest of the request, keys sorted: however it was formatted, it hashes alike."""
        canonical = json.dumps(
            [self.route, self.body],
            sort_keys=True,
            separators=(",", ":"),
            ensure_ascii=False,
            default=str,  # a YAML form's dates
        )
        return hashlib.sha256(canonical.encode()).hexdigest()
