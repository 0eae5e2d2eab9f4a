"""`<artifacts>/checkpoints.jsonl`: every checkpoint of `opd run`, recorded as it is written,
so `opd run SPEC --resume` finds the last saved state without parsing paths."""

from __future__ import annotations

import json
from pathlib import Path

from worker.engine.loop.state import SavedState
from worker.engine.tracking.sinks import Sink

CHECKPOINT_LOG = "checkpoints.jsonl"


class CheckpointLog(Sink):
    """Appends {"step", "kind", "path"} per checkpoint; a resumed run extends the file."""

    def __init__(self, artifacts: Path) -> None:
        artifacts.mkdir(parents=True, exist_ok=True)
        self.path = artifacts / CHECKPOINT_LOG

    def checkpoint(self, step: int, kind: str, path: str) -> None:
        with self.path.open("a", encoding="utf-8") as log:
            log.write(json.dumps({"step": step, "kind": kind, "path": path}) + "\n")


def records(artifacts: Path) -> list[dict]:
    path = artifacts / CHECKPOINT_LOG
    if not path.is_file():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def sampler_weights(artifacts: Path) -> dict[int, str]:
    """Every step's recorded sampler weights (the latest of a step): a run with
    loop.max_steps_off_policy resumes sampling from some of them."""
    return {r["step"]: r["path"] for r in records(artifacts) if r["kind"] == "sampler"}


def latest_state(artifacts: Path) -> SavedState | None:
    """The last `state` checkpoint the log records, or None (no log, or no state yet),
    with the sampler weights recorded before its step."""
    states = [r for r in records(artifacts) if r["kind"] == "state"]
    if not states:
        return None
    step = states[-1]["step"]
    samplers = {v: path for v, path in sampler_weights(artifacts).items() if v < step}
    return SavedState(states[-1]["path"], step, samplers)
