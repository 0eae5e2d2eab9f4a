"""benchmarks/peers.py on a tiny setting: TRL's DistillationTrainer (the `bench` extra) and
two opd runs, one seed, two steps, a few held-out problems. Accuracies and times depend on
the machine, so the tables' shape is checked, and that TRL trained the LoRA the eval graded."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.benchmarks.scripts import run_benchmark

TINY = (
    *("--seeds", "7", "--steps", "2", "--every", "1", "--holdout", "6", "--eval-samples", "2"),
    *("--betas", "0.5", "--objectives", "sampled_reverse_kl", "{kind: forward_kl, top_k: 8}"),
    *("--shapes", "8x4"),
)
PEERS = ["TRL JSD (beta 0.5)", "opd sampled_reverse_kl (8x4)", "opd forward_kl top-8 (8x4)"]
PERCENT = r"\d+\.\d%"


def test_reports_trl_and_opd_graded_alike_side_by_side(tmp_path: Path) -> None:
    figures_file = tmp_path / "figures.json"

    run = run_benchmark(
        "peers.py", *TINY, "--json", str(figures_file), tmp_path=tmp_path, timeout=300
    )

    assert run.returncode == 0, run.stderr
    out = run.stdout
    assert re.search(rf"problems x 2 answers\): student before {PERCENT}, teacher", out), out
    for step in (1, 2):
        assert re.search(rf"^step {step} +seed 7 +mean$", out, re.M), out
    for label in PEERS:
        escaped = re.escape(label)
        assert re.search(rf"^{escaped} +{PERCENT} +{PERCENT}$", out, re.M), out
        summary = rf"^{escaped} +{PERCENT} +-?\d+% +[\d.]+ s +\d+ ms +(\d+\.\d\dx|not reached)$"
        assert re.search(summary, out, re.M), out
    figures = json.loads(figures_file.read_text())
    assert list(figures["runs"]) == PEERS
    for label in PEERS:
        (seed_run,) = figures["runs"][label]
        assert seed_run["seed"] == 7 and seed_run["steps"] == [0, 1, 2]
        assert len(seed_run["accuracy"]) == 3 and seed_run["trained_seconds"] > 0
        assert seed_run["teacher"] > 0.5  # the eval's teacher baseline ran
    # The eval's sampler read the adapter TRL trained: LoRA's B starts at zero.
    assert figures["runs"]["TRL JSD (beta 0.5)"][0]["lora_b_norm"] > 0
    assert figures["summary"]["trl_best"] == "TRL JSD (beta 0.5)"

    again = run_benchmark("peers.py", "--tables", str(figures_file), tmp_path=tmp_path, timeout=60)
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() in out
