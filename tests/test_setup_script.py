"""`scripts/setup.sh` says what it is doing at each step and shows pip's lines (not the
ones for packages already there), and fails when pip fails. Run on a copy of the script
whose `.venv` holds a stand-in python that answers as pip does, so nothing is installed."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "setup.sh"
PIP = """#!/bin/sh
echo "Requirement already satisfied: httpx in ./.venv"
echo "Collecting torch==2.13.0"
exit {status}
"""


def setup(tmp_path: Path, status: int) -> subprocess.CompletedProcess[str]:
    (tmp_path / "scripts").mkdir()
    shutil.copy(SCRIPT, tmp_path / "scripts" / "setup.sh")
    python = tmp_path / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(PIP.format(status=status))
    python.chmod(0o755)
    return subprocess.run(
        ["bash", str(tmp_path / "scripts" / "setup.sh")], capture_output=True, text=True
    )


def test_each_step_is_announced_with_pips_own_lines(tmp_path):
    done = setup(tmp_path, 0)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    steps = [line.split(" (")[0] for line in lines if line.startswith("setup: [")]
    assert steps == [
        "setup: [1/4] the virtual environment .venv",
        "setup: [2/4] pip",
        "setup: [3/4] torch 2.13.0",
        "setup: [4/4] the project with the 'local' extra",
    ]
    assert lines.count("Collecting torch==2.13.0") == 3
    assert not any(line.startswith("Requirement already satisfied") for line in lines)
    assert lines[-1].startswith("setup: done in ")


def test_a_failed_install_fails_the_setup(tmp_path):
    done = setup(tmp_path, 1)
    assert done.returncode != 0
    assert "setup: [2/4] pip" in done.stdout and "setup: done" not in done.stdout
