"""`opd worker` whose remote backend (`trio`) is the tests' fake PyTRIO service
(tests/fakes/trio.py), each request taking `latency` seconds: a worker of a fleet on one
machine whose jobs wait on a remote service, as they would, instead of computing.

    python benchmarks/fake_trio_worker.py 0.5     # OPD_* settings as for `opd worker`

(benchmarks/fleet.py starts these.) It loads no torch: a remote-backend worker does not.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import pytrio  # noqa: E402
from pytrio.config.config import auth_state  # noqa: E402

from opd.cli.common import settings  # noqa: E402
from opd.cli.service import logging_setup  # noqa: E402
from tests.fakes.trio import FakeServiceClient  # noqa: E402
from worker.service.main import serve_worker  # noqa: E402


def main(latency: float) -> None:
    """One fake service for the whole process (PyTRIO's ServiceClient is one per job there:
    the fake keeps every job's checkpoints, as the remote service does)."""
    fake = FakeServiceClient(latency=latency)
    auth_state.api_key = "fake-key"
    auth_state.config_error = None
    pytrio.ServiceClient = lambda: fake
    logging_setup()
    asyncio.run(serve_worker(settings()))


if __name__ == "__main__":
    main(float(sys.argv[1]))
