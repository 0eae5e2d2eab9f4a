"""`import opd` (the SDK) loads neither torch nor the worker: a notebook or an eval script
that talks to the API needs the service's light dependencies only."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("torch", "transformers", "peft", "worker", "pytrio", "tinker")


def test_importing_the_sdk_loads_no_torch_and_no_worker():
    probe = (
        "import json, sys; from opd import Client, AsyncClient; "
        f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r})))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120
    )
    assert json.loads(loaded.stdout) == []
