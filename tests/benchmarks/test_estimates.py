"""benchmarks/estimates.py on the tiny example cut to two steps: the run is estimated cold
and warm (from a pilot with another seed), the table has a row for each, the actual lies
inside the bounds of both, and the warm point is within the target."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.benchmarks.scripts import run_benchmark

SHORT = ("--cases", "examples", "--examples", "tiny.yaml", "--steps", "2")


def test_the_tiny_example_is_estimated_cold_and_warm_inside_the_bounds(tmp_path: Path):
    figures = tmp_path / "estimates.json"
    run = run_benchmark(
        "estimates.py", *SHORT, "--json", str(figures), tmp_path=tmp_path, timeout=300
    )

    found = json.loads(figures.read_text())
    assert run.returncode == 0, run.stdout + run.stderr
    assert [r["case"] for r in found["runs"]] == ["tiny.yaml"]
    for result in found["runs"]:
        for kind in ("cold", "warm"):
            for figure, judged in result[kind].items():
                assert judged["inside"], (result["case"], kind, figure, judged)
            assert result[kind]["total_tokens"]["actual"] > 0
        assert re.search(rf"^{re.escape(result['case'])} +warm +[\d,]+", run.stdout, re.M)
    assert abs(found["runs"][0]["warm"]["total_tokens"]["error"]) <= 0.25
    assert "targets met" in run.stdout
