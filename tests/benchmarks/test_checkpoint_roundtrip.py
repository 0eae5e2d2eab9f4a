"""benchmarks/checkpoint_roundtrip.py runs end to end with one small round trip per store
(its own moto server), reports both side by side and leaves nothing behind. Timings are
not asserted: they depend on the machine."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.benchmarks.scripts import run_benchmark


def test_reports_the_round_trip_through_a_bucket_beside_the_folder(tmp_path: Path) -> None:
    figures_file = tmp_path / "figures.json"
    run = run_benchmark(
        "checkpoint_roundtrip.py",
        *("--rounds", "1", "--pad-mb", "1", "--json", str(figures_file)),
        tmp_path=tmp_path,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    for store in ("folder", "s3"):
        assert re.search(rf"^{store} +[\d.]+( +[\d.]+){{5}}$", run.stdout, re.M), run.stdout
    figures = json.loads(figures_file.read_text())
    assert figures["s3"]["mb"] == figures["folder"]["mb"] > 1.0  # the same files came back
    assert figures["s3"]["upload"] > 0 and figures["s3"]["fetch"] > 0
    assert figures["folder"]["upload"] == figures["folder"]["fetch"] == 0
    # Its own temporary folder only: torch keeps a compile cache in TMPDIR, not the script.
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("opd-ckpt-")]
