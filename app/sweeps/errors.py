"""What the sweep store refuses."""

from __future__ import annotations


class SweepNotFound(LookupError):
    """No sweep with this id (or none the caller may see)."""
