"""`opd worker` whose remote backend (`trio`) is the tests' fake PyTRIO service
(tests/fakes/trio.py), each request taking `latency` seconds: a worker of a fleet on one
machine whose jobs wait on a remote service, as they would, instead of computing.

    python benchmarks/fake_trio_worker.py 0.5     # OPD_* settings as for `opd worker`

(benchmarks/fleet.py starts these.) It loads no torch: a remote-backend worker does not.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import os
import pickle
import sys
from collections.abc import Iterator, MutableMapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import pytrio  # noqa: E402
from pytrio.config.config import auth_state  # noqa: E402

from opd.cli.common import settings  # noqa: E402
from opd.cli.service import logging_setup  # noqa: E402
from tests.fakes.trio import Checkpoint, FakeServiceClient  # noqa: E402
from worker.service.main import serve_worker  # noqa: E402


class SharedCheckpoints(MutableMapping[str, Checkpoint]):
    """The fake's checkpoints in a folder every worker of the fleet reads, as the remote
    service keeps them for any client: a job taken over resumes from what another saved."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)

    def file(self, path: str) -> Path:
        return self.folder / hashlib.sha256(path.encode()).hexdigest()

    def __getitem__(self, path: str) -> Checkpoint:
        try:
            return pickle.loads(self.file(path).read_bytes())[1]
        except FileNotFoundError:
            raise KeyError(path) from None

    def __setitem__(self, path: str, saved: Checkpoint) -> None:
        partial = self.file(path).with_suffix(f".{os.getpid()}")
        partial.write_bytes(pickle.dumps((path, saved)))
        partial.replace(self.file(path))

    def __delitem__(self, path: str) -> None:
        self.file(path).unlink()

    def __iter__(self) -> Iterator[str]:
        for file in self.folder.glob("[0-9a-f]" * 64):
            yield pickle.loads(file.read_bytes())[0]

    def __len__(self) -> int:
        return len(list(self.folder.glob("[0-9a-f]" * 64)))


def main(latency: float) -> None:
    """One fake service for the whole process (PyTRIO's ServiceClient is one per job there:
    the fake keeps every job's checkpoints, as the remote service does)."""
    fake = FakeServiceClient(latency=latency)
    fake.checkpoints = SharedCheckpoints(Path(os.environ["OPD_HOME"]) / "fake-trio")
    fake.run_ids = (f"{os.getpid()}-{n}" for n in itertools.count())
    auth_state.api_key = "fake-key"
    auth_state.config_error = None
    pytrio.ServiceClient = lambda: fake
    logging_setup()
    asyncio.run(serve_worker(settings()))


if __name__ == "__main__":
    main(float(sys.argv[1]))
