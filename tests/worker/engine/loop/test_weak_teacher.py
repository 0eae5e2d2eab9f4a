"""A teacher whose prompts are not rendered as it learned them answers far below what its
preset measured; the job says so at step 0 (a warning event carrying a note, which the job
page shows), where it used to say nothing while the student learned nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kernel.spec import JobSpec
from kernel.spec.data import DEFAULT_QUESTION_SUFFIX
from tests.fakes.sinks import RecordingSink
from worker.engine.loop.job import run_job

ROOT = Path(__file__).resolve().parents[4]


def short_demo(**dataset: object) -> JobSpec:
    spec = yaml.safe_load((ROOT / "examples" / "arith.yaml").read_text())
    spec["loop"] |= {"steps": 1, "batch_size": 2, "group_size": 1}
    spec["eval"] |= {"every": 0, "holdout": 40}
    spec["dataset"] |= dataset
    spec["local"] |= {"device": "cpu"}
    return JobSpec.model_validate(spec)


@pytest.mark.parametrize(
    ("suffix", "noted"), [(DEFAULT_QUESTION_SUFFIX, True), ("Answer in \\boxed{}.", False)]
)
async def test_a_teacher_far_below_its_preset_is_noted(
    tmp_path: Path, suffix: str, noted: bool
) -> None:
    sink = RecordingSink()

    await run_job(
        short_demo(question_suffix=suffix), sink, artifact_dir=tmp_path, data_root=tmp_path
    )

    notes = [
        data for level, _, data in sink.events if level == "warning" and data and "note" in data
    ]
    teacher = sink.steps[0]["eval/teacher_accuracy"]  # the eval at step 0 is step 0's
    assert bool(notes) is noted, (teacher, sink.events)
    if noted:
        assert notes[0]["note"] == "weak_teacher" and notes[0]["teacher_accuracy"] == teacher
        assert notes[0]["expected"] > 2 * teacher
