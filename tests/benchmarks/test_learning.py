"""benchmarks/learning.py on a tiny setting: two studies, one seed, two steps. Accuracies
and times depend on the machine and the seeds, so only the tables' shape is checked, and
that the off-policy study ran the remote engine's pipelined loop."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from tests.benchmarks.scripts import BENCHMARKS, run_benchmark

sys.path.insert(0, str(BENCHMARKS))
from learning import Curve, Row  # the benchmarks folder is no package

TINY = (
    *("--studies", "losses", "off_policy", "--values", "importance_sampling", "0", "1"),
    *("--seeds", "1", "--steps", "2", "--every", "1", "--holdout", "6"),
    *("--latency-scale", "0.1"),
)
CELL = r"\d+% ± \d+%"


def test_reports_accuracy_against_steps_and_wall_time(tmp_path: Path) -> None:
    figures_file = tmp_path / "figures.json"

    run = run_benchmark(
        "learning.py", *TINY, "--json", str(figures_file), tmp_path=tmp_path, timeout=600
    )

    assert run.returncode == 0, run.stderr
    out = run.stdout
    assert "losses: loop.loss_fn, held-out accuracy (mean ± sd over seeds), teacher" in out
    assert re.search(r"^vs steps +step 0 +step 1 +step 2$", out, re.M), out
    assert re.search(rf"^importance_sampling +{CELL} +{CELL} +{CELL}$", out, re.M), out
    assert re.search(r"^vs wall time( +[\d.]+ s){4}$", out, re.M), out
    for k in (0, 1):
        assert re.search(rf"^{k} +{CELL} +{CELL} +{CELL}$", out, re.M), out
        assert re.search(rf"^  k = {k}: (\d+ s|not reached)$", out, re.M), out
    figures = json.loads(figures_file.read_text())
    assert set(figures) == {"losses", "off_policy"}
    runs = figures["off_policy"]["rows"][1]["runs"]
    assert runs[0]["steps"] == [0, 1, 2] and len(runs[0]["accuracy"]) == 3
    assert 0 <= runs[0]["seconds"][0] <= runs[0]["seconds"][-1]
    assert set(figures["off_policy"]["time_to_on_policy_final"]) == {"0", "1"}
    assert re.search(r"^the steps took: 0: \d+ s, 1: \d+ s$", out, re.M), out

    again = run_benchmark(
        "learning.py", "--tables", str(figures_file), tmp_path=tmp_path, timeout=120
    )
    assert again.returncode == 0, again.stderr
    # The same tables: the output less its first and last lines and each run's own line.
    kept = [line for line in out.splitlines() if not re.match(r"  \S+ \S+ seed \d+: ", line)]
    assert again.stdout.splitlines() == kept[1:-2]


def test_the_time_to_reach_an_accuracy_is_where_the_mean_over_seeds_reaches_it() -> None:
    low = Curve(steps=[0, 10, 20], seconds=[0.0, 5.0, 10.0], accuracy=[0.0, 0.2, 0.3])
    high = Curve(steps=[0, 10, 20], seconds=[0.0, 7.0, 12.0], accuracy=[0.0, 0.3, 0.5])
    row = Row(0, [low, high])

    assert row.time_to_reach(0.4) == 11.0  # the mean is 0.4 at the last eval only
    assert row.time_to_reach(0.25) == 6.0
    assert row.time_to_reach(0.41) is None
