"""A cold start (`loop.cold_start`): the first steps train on the teacher's answers, or the
dataset's reference answers, as the student's tokens; the steps after it sample on-policy,
and a run resumed inside the cold start repeats the uninterrupted one."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from kernel.spec import JobSpec
from tests.fakes.sinks import RecordingSink
from worker.engine.backends.local import LocalServiceClient
from worker.engine.data.datasets import load_datasets
from worker.engine.loop.state import RunResult, SavedState, Stop
from worker.engine.loop.steps import run_loop

ANSWER = re.compile(r"\\boxed\{(-?\d+)\}")


def job(teacher: str = "arith-teacher", **cold_start: Any) -> JobSpec:
    return JobSpec.model_validate(
        {
            "name": "cold",
            "backend": "local",
            "student": {"base_model": "arith-student", "lora_rank": 8, "seed": 3},
            "teacher": {"base_model": teacher},
            "dataset": {"source": "arithmetic", "count": 150, "seed": 42},
            "sampling": {"max_tokens": 12},
            "loop": {
                "steps": 3,
                "batch_size": 4,
                "group_size": 2,
                "keep_samples": 8,
                "save_every": 1,
                "cold_start": {"steps": 2} | cold_start,
            },
            "local": {"device": "cpu"},
        }
    )


async def run(
    spec: JobSpec,
    folder: Path,
    resume: SavedState | None = None,
    stop_after: int | None = None,
) -> tuple[RecordingSink, RunResult]:
    sink = RecordingSink()
    result = await run_loop(
        spec,
        LocalServiceClient(spec.local, folder),
        load_datasets(spec, folder, False),
        sink,
        resume=resume,
        should_stop=lambda: Stop.resume if stop_after and len(sink.steps) >= stop_after else None,
    )
    return sink, result


def right(sink: RecordingSink, step: int) -> int:
    """How many of the step's kept completions box the right answer to their question."""
    count = 0
    for sample in sink.kept[step]:
        left, op, right_ = re.match(r"What is (\d+) (.) (\d+)\?", sample.prompt).groups()  # type: ignore[union-attr]
        expected = {"+": int(left) + int(right_), "-": int(left) - int(right_)}.get(
            op, int(left) * int(right_)
        )
        found = ANSWER.findall(sample.completion)
        count += bool(found) and int(found[-1]) == expected
    return count


@pytest.mark.parametrize("teacher", ["arith-teacher", "arith-teacher-bpe"])
async def test_the_first_steps_train_on_the_teachers_answers(tmp_path, teacher):
    """The teacher (99.6% right held out; over another tokenizer too) writes the cold
    start's completions; the untrained student (1%) writes the step after it."""
    sink, _ = await run(job(teacher), tmp_path)

    assert [len(sink.kept[s]) for s in range(3)] == [8, 8, 8]
    assert right(sink, 0) >= 7 and right(sink, 1) >= 7
    assert right(sink, 2) <= 2
    for step in (0, 1):  # ended as the student ends a turn, where the teacher stopped
        assert all(sample.tokens[-1] == "<|im_end|>" for sample in sink.kept[step])
    assert ("info", "Steps 0 to 1 train on the teacher's answers (loop.cold_start)", None) in [
        (level, message, None) for level, message, _ in sink.events
    ]


async def test_a_cold_start_on_the_reference_answers_trains_each_prompt_once(tmp_path):
    sink, _ = await run(job(source="reference"), tmp_path)

    assert [sink.steps[s]["data/datums"] for s in range(3)] == [4, 4, 8]
    for sample in sink.kept[0]:
        assert sample.completion.strip().lstrip("-").isdigit()
        assert sample.tokens[-1] == "<|im_end|>"


async def test_a_run_resumed_inside_its_cold_start_repeats_the_uninterrupted_run(tmp_path):
    """A teacher of random weights (its answers vary with every draw) answers each prompt
    of the resumed steps as it did in the uninterrupted run, whatever it was asked before."""
    spec = job("tiny-teacher")
    whole, _ = await run(spec, tmp_path / "whole")
    _, result = await run(spec, tmp_path / "stopped", stop_after=1)
    assert result.stopped and result.state is not None and result.state.step == 1

    resumed, _ = await run(spec, tmp_path / "stopped", resume=result.state)

    assert sorted(resumed.steps) == [1, 2]
    for step in (1, 2):
        for key in ("opd/reverse_kl_mean", "trainer/loss_sum", "data/completion_tokens_total"):
            assert resumed.steps[step][key] == whole.steps[step][key], (step, key)
    assert [s.completion for s in resumed.kept[1]] == [s.completion for s in whole.kept[1]]
