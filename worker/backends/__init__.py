"""Training backends behind one PyTRIO-shaped interface (see `base.py`)."""

from __future__ import annotations

from pathlib import Path

from app.spec import JobSpec
from worker.backends.base import ServiceClient


def connect(spec: JobSpec, artifact_dir: Path) -> ServiceClient:
    """The service client for the spec's backend; heavy imports happen only here."""
    if spec.backend == "trio":
        from worker.backends.trio import connect_trio

        return connect_trio(spec.trio)
    from worker.backends.local import LocalServiceClient

    return LocalServiceClient(spec.local, artifact_dir)
