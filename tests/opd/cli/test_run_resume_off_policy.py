"""`opd run --resume` of a `max_steps_off_policy: 1` job on Tinker (the fake service): the
state is found in checkpoints.jsonl with the sampler weights its next step samples from,
and the resumed run repeats the uninterrupted run's steps."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from opd.cli import main
from tests.fakes.tinker import FakeServiceClient, patch_tinker

SPEC = {
    "name": "tinker-off-policy",
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
        "steps": 6,
        "batch_size": 2,
        "group_size": 2,
        "save_every": 2,
        "max_steps_off_policy": 1,
        "save_weights_name": "tinker-off-policy",
    },
    "tinker": {"call_retry_delay_seconds": 0.001},
}
COMPARED = ("opd/reverse_kl_mean", "trainer/loss_sum", "train/staleness_max")


def read_metrics(path: str) -> dict[int, dict[str, float]]:
    return {row["step"]: row for row in map(json.loads, Path(path).read_text().splitlines())}


def test_a_crashed_run_resumes_from_the_log_with_the_sampler_weights_it_kept(
    tmp_path, monkeypatch
) -> None:
    service = FakeServiceClient()
    patch_tinker(monkeypatch, service)
    monkeypatch.chdir(tmp_path)
    Path("spec.yaml").write_text(yaml.safe_dump(SPEC))
    assert main(["run", "spec.yaml", "--metrics-out", "whole.jsonl"]) == 0

    # As if the run had died right after saving its state at step 4.
    log = Path("runs/tinker-off-policy/checkpoints.jsonl")
    records = [json.loads(line) for line in log.read_text().splitlines()]
    cut = next(i for i, r in enumerate(records) if (r["step"], r["kind"]) == (4, "state"))
    log.write_text("".join(json.dumps(record) + "\n" for record in records[: cut + 1]))
    [kept] = [r["path"] for r in records[:cut] if (r["step"], r["kind"]) == (3, "sampler")]
    assert main(["run", "spec.yaml", "--resume", "--metrics-out", "resumed.jsonl"]) == 0

    whole, resumed = read_metrics("whole.jsonl"), read_metrics("resumed.jsonl")
    assert sorted(resumed) == [4, 5]
    for step in (4, 5):
        for key in COMPARED:
            assert resumed[step][key] == whole[step][key], (step, key)
    assert kept in [call.request.model_path for call in service.calls_named("create_sampler")]
