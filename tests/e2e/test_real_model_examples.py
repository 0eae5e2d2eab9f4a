"""The shipped real-model examples run as a user runs them (`opd run`), cut to two steps:
not learning tests (benchmarks/cross_family.py and real_model.py measure what they learn),
but every part the example names works on SmolLM2 itself: a teacher of another family read
across tokenizers, the cold start on its answers, the byte-level objective, the eval."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support import converted_smollm2

pytestmark = pytest.mark.timeout(900)  # a 135M model on a loaded 2-core machine

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def model_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return converted_smollm2(tmp_path_factory)


def run_example(spec: dict, model_cache: Path, tmp_path: Path) -> tuple[str, list[dict]]:
    """`opd run` of an example's spec, as a user runs it: its log and its metrics' rows. Its
    data root is a copy of the examples' files (the run keeps its dataset cache there, not
    in the repository)."""
    shutil.copytree(ROOT / "examples" / "data", tmp_path / "examples" / "data")
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    metrics = tmp_path / "metrics.jsonl"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "opd.cli",
            "run",
            str(path),
            "--metrics-out",
            str(metrics),
            "--artifacts",
            str(tmp_path / "art"),
            "--data-root",
            str(tmp_path),
        ],
        env=os.environ | {"OPD_MODEL_CACHE": str(model_cache), "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=840,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stderr, [json.loads(line) for line in metrics.read_text().splitlines()]


def test_the_arith_teacher_example_runs_its_cold_start_then_distils_across_tokenizers(
    model_cache: Path, tmp_path: Path
) -> None:
    spec = yaml.safe_load((ROOT / "examples" / "smollm2-arith-teacher.yaml").read_text())
    spec["loop"] |= {"steps": 2, "batch_size": 2, "cold_start": {"steps": 1}}
    spec["eval"] |= {"every": 2, "holdout": 3, "teacher_baseline": False}
    spec["local"]["cpu_threads"] = 1
    log, rows = run_example(spec, model_cache, tmp_path)
    steps = [row for row in rows if "opd/reverse_kl_mean" in row]
    assert [row["step"] for row in steps] == [0, 1], rows
    assert "train on the teacher's answers (loop.cold_start)" in log
    assert "another tokenizer" in log, "the preflight names the pair"
    assert all(0 < row["data/completion_tokens_total"] <= 2 * 2 * 16 for row in steps)
    evals = [row for row in rows if "eval/accuracy" in row]
    assert [row["step"] for row in evals] == [0, 2], "before and after, graded by math-verify"
    assert all(0.0 <= row["eval/accuracy"] <= 1.0 for row in evals)


def test_the_prompt_bake_example_routes_each_dataset_to_its_own_teacher(
    model_cache: Path, tmp_path: Path
) -> None:
    """The self-distillation example: the prompted base teaches the arithmetic, the base
    as it was the everyday prompts; the eval grades the format beside the prompted
    teacher's own answers and measures the drift on held-out everyday prompts."""
    spec = yaml.safe_load((ROOT / "examples" / "smollm2-prompt-bake.yaml").read_text())
    spec["loop"] |= {"steps": 2, "batch_size": 3}
    spec["eval"] |= {"every": 2, "holdout": 2}
    spec["local"]["cpu_threads"] = 1
    _, rows = run_example(spec, model_cache, tmp_path)
    steps = [row for row in rows if "opd/reverse_kl_mean" in row]
    assert [row["step"] for row in steps] == [0, 1], rows
    for row in steps:  # 2 problems and 1 everyday prompt a step, each by its own teacher
        assert {"opd/reverse_kl_mean/arithmetic", "opd/reverse_kl_mean/everyday"} <= set(row)
    evals = [row for row in rows if "eval/accuracy" in row]
    assert [row["step"] for row in evals] == [0, 2]
    assert 0.0 <= evals[0]["eval/teacher_accuracy"] <= 1.0, "the prompted teacher's own, once"
    assert evals[0]["eval/reverse_kl_mean/everyday"] == pytest.approx(0.0, abs=1e-4), (
        "before training the student is the base: no drift"
    )
