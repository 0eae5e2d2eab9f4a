"""A tiny job trained once per test session on the local backend, for the tests that use
what a job produced (the playground, continuing a job, exporting its weights)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from kernel.spec import JobSpec
from tests.fakes.sinks import RecordingSink
from worker.engine.loop.job import run_job

ROOT = Path(__file__).resolve().parents[3]
TRAINED_STEPS = 3


def tiny_spec(**student: object) -> JobSpec:
    """examples/tiny.yaml, shortened, on the CPU, without its eval."""
    raw = yaml.safe_load((ROOT / "examples" / "tiny.yaml").read_text())
    del raw["eval"]
    raw["loop"] |= {"steps": TRAINED_STEPS, "batch_size": 2, "group_size": 2}
    raw["local"] = {"device": "cpu"}
    raw["student"] |= student
    return JobSpec.model_validate(raw)


@dataclass(frozen=True)
class Trained:
    spec: JobSpec
    artifacts: Path
    checkpoints: dict[tuple[int, str], str]
    """Paths by (step, kind): the final state and sampler weights at TRAINED_STEPS."""

    @property
    def final(self) -> str:
        return self.checkpoints[TRAINED_STEPS, "final"]


@pytest.fixture(scope="session")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Trained:
    spec = tiny_spec()
    artifacts = tmp_path_factory.mktemp("trained")
    sink = RecordingSink()
    asyncio.run(run_job(spec, sink, artifact_dir=artifacts, data_root=artifacts))
    return Trained(spec, artifacts, {(step, kind): path for step, kind, path in sink.checkpoints})
