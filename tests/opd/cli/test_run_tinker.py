"""`opd run` with `backend: tinker`, against the fake Tinker service.

The command runs in this process (`opd.cli.main`), so that Tinker's SDK can be swapped for
the fake; everything from the spec file to the metrics file is the real code path.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from opd.cli import main
from tests.fakes.tinker import FakeServiceClient, patch_tinker

SPEC = {
    "name": "tinker-opd",
    "backend": "tinker",
    "student": {"base_model": "tiny-student", "lora_rank": 8},
    "teacher": {"base_model": "tiny-teacher"},
    "dataset": {
        "source": "inline",
        "question_suffix": "",
        "prompts": ["What is 2 + 3?", "Compute 7 * 8.", "Is 17 prime?"],
    },
    "sampling": {"max_tokens": 8},
    "loop": {
        "steps": 4,
        "batch_size": 2,
        "group_size": 2,
        "save_every": 2,
        "save_weights_name": "tinker-opd",
    },
    "tinker": {"call_retry_delay_seconds": 0.001},
}


def read_metrics(path: Path) -> dict[int, dict[str, float]]:
    return {row["step"]: row for row in map(json.loads, path.read_text().splitlines())}


def test_opd_run_trains_on_tinker_and_saves_there(tmp_path, monkeypatch, capsys) -> None:
    service = FakeServiceClient()
    patch_tinker(monkeypatch, service)
    monkeypatch.chdir(tmp_path)
    Path("tinker.yaml").write_text(yaml.safe_dump(SPEC))

    assert main(["run", "tinker.yaml", "--metrics-out", "metrics.jsonl"]) == 0

    final = capsys.readouterr().out.strip().splitlines()[-1].removeprefix("Saved weights: ")
    assert final == "tinker://run-0/sampler_weights/tinker-opd"
    assert set(service.checkpoints) == {
        final,
        "tinker://run-0/weights/tinker-opd-state-000002",
        "tinker://run-0/sampler_weights/tinker-opd-000002",
        "tinker://run-0/weights/tinker-opd-state-000004",
    }
    metrics = read_metrics(Path("metrics.jsonl"))
    assert sorted(metrics) == [0, 1, 2, 3]
    losses = [call.result.metrics["loss:sum"] for call in service.calls_named("forward_backward")]
    assert [metrics[step]["trainer/loss_sum"] for step in range(4)] == losses
    assert len(service.calls_named("optim_step")) == 4
