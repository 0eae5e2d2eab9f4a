"""The built-in arithmetic presets: they load only as committed, and they still do what the
manifest says they do, measured again with the eval's grader (on a small seeded sample of
the problems, so within a margin)."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
import torch

from kernel.model_names import TRAINED_PRESETS
from kernel.spec import ArithmeticDataset, LocalBackendSpec
from worker.engine.backends.local import LocalServiceClient
from worker.engine.backends.local.presets import preset_tokenizer
from worker.engine.backends.local.trained import (
    WEIGHTS_DIR,
    PresetCorrupt,
    read_manifest,
    trained_model,
)
from worker.engine.data.arithmetic import training_problems
from worker.engine.eval.grading import Grader
from worker.engine.eval.sampler_accuracy import answer

MANIFEST = read_manifest()
SAMPLE = 40  # problems per operation
MARGIN = 0.15
# The targets: (op or None for all, lowest accuracy, highest accuracy).
TARGETS = {
    "arith-teacher": [("add", 0.9, 1.0), ("sub", 0.9, 1.0), ("mul", 0.9, 1.0)],
    "arith-student": [(None, 0.0, 0.3)],
    "arith-teacher-add": [("add", 0.9, 1.0), ("mul", 0.0, 0.3)],
    "arith-teacher-mul": [("mul", 0.9, 1.0), ("add", 0.0, 0.3)],
    "arith-teacher-template": [("add", 0.9, 1.0), ("sub", 0.9, 1.0), ("mul", 0.9, 1.0)],
    "arith-teacher-bpe": [("add", 0.9, 1.0), ("sub", 0.9, 1.0), ("mul", 0.9, 1.0)],
}


# The tests that share one grader share its event loop too.
in_module_loop = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def grader() -> AsyncIterator[Grader]:
    async with Grader(workers=2) as shared:
        yield shared


def test_every_preset_is_in_the_manifest_and_meets_its_targets_there() -> None:
    assert set(MANIFEST) == set(TRAINED_PRESETS)
    for name, targets in TARGETS.items():
        measured = MANIFEST[name]["measured"]
        assert measured["boxed"] >= 0.9, name
        for op, low, high in targets:
            key = f"accuracy_{op}" if op else "accuracy"
            assert low <= measured[key] <= high, (name, key, measured[key])
    weights = sum((WEIGHTS_DIR / entry["file"]).stat().st_size for entry in MANIFEST.values())
    assert weights < 8 * 2**20


def test_a_preset_whose_file_changed_is_refused(tmp_path: Path) -> None:
    shutil.copytree(WEIGHTS_DIR, tmp_path, dirs_exist_ok=True)
    name = "arith-student"
    assert isinstance(trained_model(name, tmp_path), torch.nn.Module)
    path = tmp_path / MANIFEST[name]["file"]
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(PresetCorrupt, match="does not match the sha256"):
        trained_model(name, tmp_path)
    path.unlink()
    with pytest.raises(PresetCorrupt, match="is missing"):
        trained_model(name, tmp_path)


@in_module_loop
@pytest.mark.parametrize("name", TRAINED_PRESETS)
async def test_the_preset_answers_as_measured(name: str, grader: Grader, tmp_path: Path) -> None:
    service = LocalServiceClient(LocalBackendSpec(device="cpu"), tmp_path)
    sampler = await service.create_sampling_client_async(name)
    entry = MANIFEST[name]
    ops = [op for op, _, _ in TARGETS[name] if op] or ["add", "sub", "mul"]
    problems = [
        p
        for op in ops
        for p in training_problems(ArithmeticDataset(**entry["problems"][op], count=SAMPLE, seed=1))
    ]
    suffix = ArithmeticDataset().question_suffix
    tokenizer = preset_tokenizer(name)  # its own chat template renders its prompts
    answers = await answer(sampler, tokenizer, problems, suffix, grader.grade_answers)

    assert answers.boxed_fraction() >= 0.9 - MARGIN
    for op, low, high in TARGETS[name]:
        assert low - MARGIN <= answers.accuracy(op) <= high + MARGIN, (op, answers.accuracy(op))
