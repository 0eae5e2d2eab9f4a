"""Training backends behind one PyTRIO-shaped interface (see `base.py`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from kernel.spec import JobSpec
from worker.engine.backends.base import ServiceClient

if TYPE_CHECKING:
    from worker.engine.backends.resilient import Warn


def connect(spec: JobSpec, artifact_dir: Path, warn: Warn) -> ServiceClient:
    """The service client for the spec's backend; heavy imports happen only here.
    The remote backend's calls are retried as `resilient.py` says; `warn` hears of each retry."""
    if spec.backend == "trio":
        from worker.engine.backends.resilient import resilient
        from worker.engine.backends.trio import connect_trio

        return resilient(connect_trio(spec.trio), spec.trio, warn)
    from worker.engine.backends.local import LocalServiceClient

    return LocalServiceClient(spec.local, artifact_dir)
