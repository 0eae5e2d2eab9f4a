"""`opd run` as a user runs it: a real process, the shipped example, real files."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[3]
TINY = ROOT / "examples" / "tiny.yaml"


def opd(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "opd.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env=os.environ | {"PYTHONPATH": str(ROOT)},
        timeout=300,
    )


def read_metrics(path: Path) -> dict[int, dict[str, float]]:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return {row["step"]: row for row in rows}


def test_tiny_example_runs_and_the_reverse_kl_falls(tmp_path):
    out = tmp_path / "metrics.jsonl"
    done = opd("run", str(TINY), "--metrics-out", str(out), "--artifacts", "art", cwd=tmp_path)

    assert done.returncode == 0, done.stderr
    weights = done.stdout.strip().splitlines()[-1].removeprefix("Saved weights: ")
    assert Path(weights, "adapter_model.safetensors").is_file()
    assert Path(weights).is_relative_to(tmp_path / "art")
    metrics = read_metrics(out)
    spec = yaml.safe_load(TINY.read_text())
    steps, every = spec["loop"]["steps"], spec["eval"]["every"]
    assert sorted(metrics) == list(range(steps + 1)), "and the eval after the last step"
    curve = [metrics[s]["opd/reverse_kl_mean"] for s in range(steps)]
    assert np.mean(curve[-5:]) <= 0.85 * np.mean(curve[:5])
    assert "step 000/60 | datums 16 |" in done.stderr
    assert "[info] Evaluating after step 0: 4 held-out prompts to answer" in done.stderr
    assert "[info] Evaluated after step 60 in " in done.stderr, "each eval says it ran"
    assert "held-out eval after step 20" in done.stderr, "and shows its prompts on a bar"
    evaluated = [s for s in sorted(metrics) if "eval/reverse_kl_mean" in metrics[s]]
    assert evaluated == list(range(0, steps + 1, every))
    held_out = [metrics[s]["eval/reverse_kl_mean"] for s in evaluated]
    assert held_out[-1] <= 0.85 * held_out[0], "the student got closer on unseen prompts"
    assert all(metrics[s]["eval/accuracy"] == 0.0 for s in evaluated), "tiny models never box"
    assert f"reverse KL (held-out prompts): {held_out[0]:.4f} -> {held_out[-1]:.4f}" in done.stdout


def small_spec(tmp_path: Path) -> Path:
    spec = yaml.safe_load(TINY.read_text())
    del spec["eval"]
    spec["loop"] |= {"steps": 8, "batch_size": 2, "group_size": 2}
    spec["sampling"]["max_tokens"] = 8
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_ctrl_c_saves_state_and_resume_reproduces_the_uninterrupted_run(tmp_path):
    spec = small_spec(tmp_path)
    whole = opd("run", str(spec), "--metrics-out", "whole.jsonl", "--artifacts", "w", cwd=tmp_path)
    assert whole.returncode == 0, whole.stderr

    run = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "opd.cli",
            "run",
            str(spec),
            "--metrics-out",
            "part.jsonl",
            "--artifacts",
            "p",
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=os.environ | {"PYTHONPATH": str(ROOT)},
    )
    assert run.stderr is not None
    for line in run.stderr:
        if line.startswith("step 001/"):
            run.send_signal(signal.SIGINT)
            break
    stdout, stderr = run.communicate(timeout=300)
    assert run.returncode == 0, stderr
    assert "Stopping at the next step boundary" in stderr
    assert stdout.strip().splitlines()[-1].endswith(f"opd run {spec} --resume --artifacts p")
    log = [
        json.loads(line) for line in (tmp_path / "p" / "checkpoints.jsonl").read_text().splitlines()
    ]
    stopped_at = log[-1]["step"]
    assert log[-1]["kind"] == "state" and 2 <= stopped_at < 8

    resumed = opd(
        "run",
        str(spec),
        "--metrics-out",
        "part.jsonl",
        "--artifacts",
        "p",
        "--resume",
        cwd=tmp_path,
    )
    assert resumed.returncode == 0, resumed.stderr
    expected, actual = read_metrics(tmp_path / "whole.jsonl"), read_metrics(tmp_path / "part.jsonl")
    assert sorted(actual) == list(range(8))
    for step in range(stopped_at, 8):
        for key in ("opd/reverse_kl_mean", "trainer/loss_sum", "data/completion_tokens_total"):
            assert actual[step][key] == expected[step][key], (step, key)


def test_a_bad_spec_is_one_line_naming_the_field(tmp_path):
    spec = yaml.safe_load(TINY.read_text())
    spec["loop"]["steps"] = 0
    spec["sampling"]["temprature"] = 1.0
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(spec))

    done = opd("run", str(path), cwd=tmp_path)

    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    assert "loop.steps" in lines[0] and "sampling.temprature" in lines[0]


def test_a_missing_spec_file_and_a_failed_run_are_one_line_errors(tmp_path):
    missing = opd("run", "nope.yaml", cwd=tmp_path)
    assert missing.returncode != 0
    assert missing.stderr.strip().splitlines() == [
        "error: cannot read spec nope.yaml: No such file or directory"
    ]

    spec = yaml.safe_load(TINY.read_text())
    spec["dataset"] = {"source": "file", "path": "absent.jsonl"}
    path = tmp_path / "absent.yaml"
    path.write_text(yaml.safe_dump(spec))
    failed = opd("run", str(path), cwd=tmp_path)
    assert failed.returncode != 0
    lines = failed.stderr.strip().splitlines()
    assert lines[-1].startswith("error: [dataset_unavailable]") and "absent.jsonl" in lines[-1]


def test_stored_completions_are_the_services_to_read_and_opd_run_says_so(tmp_path):
    spec = yaml.safe_load(TINY.read_text())
    spec["dataset"] = {"source": "stored_completions", "filter": {"has_feedback": True}}
    path = tmp_path / "stored.yaml"
    path.write_text(yaml.safe_dump(spec))
    done = opd("run", str(path), "--artifacts", "out", cwd=tmp_path)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "error: dataset.source: stored_completions reads the team's stored completions, which "
        "the service fills in when the job is submitted, and opd run has no service: submit "
        "the spec to one (opd jobs create SPEC)"
    ]
    assert not (tmp_path / "out").exists()


def test_resume_needs_a_recorded_state_or_an_explicit_step(tmp_path):
    spec = small_spec(tmp_path)
    nothing = opd("run", str(spec), "--artifacts", "empty", "--resume", cwd=tmp_path)
    assert nothing.returncode == 1
    assert "no saved state recorded" in nothing.stderr
    unstepped = opd("run", str(spec), "--resume-from", "some/state", cwd=tmp_path)
    assert unstepped.returncode == 1
    assert "--resume-from needs --resume-step" in unstepped.stderr
