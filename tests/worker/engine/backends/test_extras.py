"""A job on a backend whose package extra is not installed fails with a message that names
the extra to install. The SDK is made unimportable in a fresh interpreter by a meta-path
finder that refuses it, as on a worker installed without the extra."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from worker.engine.backends import extra_installed

ROOT = Path(__file__).resolve().parents[4]
WITHOUT_TINKER = """
import asyncio, json, sys
from importlib.abc import MetaPathFinder

class Refuse(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "tinker":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)

sys.meta_path.insert(0, Refuse())
from kernel.errors import OPDError
from kernel.spec import JobSpec
from tests.fakes.sinks import RecordingSink
from worker.engine.loop.job import run_job

dataset = {"source": "inline", "prompts": ["a"]}
models = {"student": {"base_model": "org/s"}, "teacher": {"base_model": "org/t"}}
spec = JobSpec.model_validate({"backend": "tinker", "dataset": dataset, **models})
try:
    asyncio.run(run_job(spec, RecordingSink(), artifact_dir=sys.argv[1], data_root=sys.argv[1]))
except OPDError as error:
    print(json.dumps({"code": error.code, "message": str(error)}))
"""


def test_a_tinker_job_without_the_tinker_sdk_says_to_install_the_tinker_extra(tmp_path):
    ran = subprocess.run(
        [sys.executable, "-c", WITHOUT_TINKER, str(tmp_path)],
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert ran.returncode == 0, ran.stderr
    failure = json.loads(ran.stdout.strip().splitlines()[-1])
    assert failure["code"] == "backend_not_installed"
    assert "backend: tinker needs the 'tinker' extra" in failure["message"]
    assert "pip install 'opd-service[tinker]'" in failure["message"]


def test_a_module_missing_for_another_reason_stays_the_bug_it_is():
    with pytest.raises(ModuleNotFoundError, match="opd_no_such_module"), extra_installed("tinker"):
        import opd_no_such_module  # noqa: F401
