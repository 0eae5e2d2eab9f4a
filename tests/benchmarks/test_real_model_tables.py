"""benchmarks/real_model.py runs its seeds apart (`--first-seed`, one --json each: a seed
of SmolLM2 and two TRL trainers takes 20 minutes and GBs); `--tables` reads them back as
one run. Here, on figures written as a run writes them (no model is loaded), that the
seeds of several files land in one table, each in its column, with their mean."""

from __future__ import annotations

import json
from pathlib import Path

from tests.benchmarks.scripts import run_benchmark

ARM = {"correct": 0.1, "reverse_kl": 0.3, "tokens": 3.0, "wall_seconds": 200.0}
PEER = ARM | {"sample_seconds": 10.0, "steps": 14}


def a_run(seed: int, compliance: float) -> dict:
    """A run's figures of one seed, opd's compliance as given."""
    facts = [True, True, False, True]
    return {
        "settings": {"steps": 10, "objective": "reverse_kl", "holdout": 60, "general": 100},
        "before": ARM
        | {
            "compliance": 0.0,
            "teacher_compliance": 0.867,
            "teacher_correct": 0.133,
            "teacher_tokens": 3.0,
            "general_kl": 0.0,
            "facts": facts,
        },
        "seeds": [
            {
                "seed": seed,
                "opd": ARM
                | {"compliance": compliance, "general_kl": 0.04, "step_seconds": 190.0}
                | {"facts": facts},
                "sft": PEER | {"compliance": 0.9, "general_kl": 1.4, "facts": facts},
                "sdft": PEER | {"compliance": 0.8, "general_kl": 1.0, "facts": facts},
            }
        ],
    }


def test_the_tables_of_runs_kept_apart_read_as_one(tmp_path: Path) -> None:
    files = []
    for seed, compliance in ((2, 0.95), (3, 0.99)):
        files.append(tmp_path / f"seed-{seed}.json")
        files[-1].write_text(json.dumps(a_run(seed, compliance)))

    run = run_benchmark(
        "real_model.py", "--tables", *map(str, files), tmp_path=tmp_path, timeout=300
    )

    lines = run.stdout.splitlines()
    header = next(line for line in lines if "seed 2" in line)
    assert header.split() == ["seed", "2", "seed", "3", "mean"], run.stderr
    opd = next(line for line in lines if line.startswith("OPD "))
    assert opd.split()[-3:] == ["95.0%", "99.0%", "97.0%"]
    assert "target: OPD's compliance >= 95%: met (97.0%)" in run.stdout


def test_the_per_answer_figure_shows_its_median_and_what_the_prose_answers_carry(
    tmp_path: Path,
) -> None:
    """One sentence among bare numbers can carry the per-answer mean: the tables show the
    median answer and the share the answers that are not a bare number carry."""
    answers = [
        {"text": "7", "kl": 0.1, "bare": True},
        {"text": "To find 3 + 4, we add", "kl": 2.9, "bare": False},
        {"text": "3", "kl": 0.2, "bare": True},
    ]
    run_ = a_run(1, 0.95)
    for arm in (run_["before"], *run_["seeds"][0].values()):
        if isinstance(arm, dict):
            arm["answers"] = answers
    path = tmp_path / "seed-1.json"
    path.write_text(json.dumps(run_))

    run = run_benchmark("real_model.py", "--tables", str(path), tmp_path=tmp_path, timeout=300)

    lines = run.stdout.splitlines()
    median = lines.index("... the median answer's")
    assert lines[median + 2].startswith("OPD ") and lines[median + 2].split()[-2:] == ["0.20"] * 2
    share = lines.index("... the share the answers that are not a bare number carry")
    assert lines[share + 2].split()[-2:] == ["90.6%"] * 2, run.stderr
