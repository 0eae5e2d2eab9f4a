"""`<artifacts>/checkpoints.jsonl`: every checkpoint of `opd run`, recorded as it is written,
so `opd run SPEC --resume` finds the last saved state without parsing paths."""

from __future__ import annotations

import json
from pathlib import Path

from worker.engine.loop import SavedState
from worker.engine.sinks import Sink

CHECKPOINT_LOG = "checkpoints.jsonl"


class CheckpointLog(Sink):
    """Appends {"step", "kind", "path"} per checkpoint; a resumed run extends the file."""

    def __init__(self, artifacts: Path) -> None:
        artifacts.mkdir(parents=True, exist_ok=True)
        self.path = artifacts / CHECKPOINT_LOG

    def checkpoint(self, step: int, kind: str, path: str) -> None:
        with self.path.open("a", encoding="utf-8") as log:
            log.write(json.dumps({"step": step, "kind": kind, "path": path}) + "\n")


def latest_state(artifacts: Path) -> SavedState | None:
    """The last `state` checkpoint the log records, or None (no log, or no state yet)."""
    path = artifacts / CHECKPOINT_LOG
    if not path.is_file():
        return None
    states = [
        SavedState(record["path"], record["step"])
        for line in path.read_text(encoding="utf-8").splitlines()
        if line.strip() and (record := json.loads(line))["kind"] == "state"
    ]
    return states[-1] if states else None
