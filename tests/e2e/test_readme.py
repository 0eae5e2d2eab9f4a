"""The README's first screen and the documentation's quick-start examples, run as written
(taken from the pages themselves, so a changed example is the example tested):

- the first screen's `scripts/demo.sh`, with the demo's spec cut to two steps (the demo
  passes its arguments to `opd serve --demo`; the learning itself is measured by
  `tests/worker/engine/loop/test_arith_learning.py`). It runs in a copy of the checkout whose
  `.venv` is this interpreter, with a pip that installs nothing: installing for real is
  what `scripts/test.sh` does before it runs this test (`tests/test_setup_script.py`
  checks what setup.sh prints). `scripts/test.sh` itself is the command running this;
- `opd run examples/tiny.yaml --metrics-out metrics.jsonl` (docs/get-started/demo.md);
- the HTTP API's curl session (docs/how-to/http-api.md) and the Python SDK's example
  (docs/how-to/sdk.md), against `opd serve` started in the folder they run in (they read its
  key from `.opd/api-key`), on a free port where the pages say 8000.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import yaml

from opd.serve import free_port, wait_until
from tests.e2e.conftest import ROOT

README = (ROOT / "README.md").read_text(encoding="utf-8")
DEFAULT_API = "127.0.0.1:8000"


def block(heading: str | None, language: str, page: str = "README.md") -> str:
    """The first `language` code block after the line `heading` of `page` (a path from the
    checkout's root; None: the page's first block)."""
    text = "\n" + (ROOT / page).read_text(encoding="utf-8")
    start = 0 if heading is None else text.index(f"\n{heading}\n")
    found = re.compile(rf"^```{language}\n(.*?)^```", re.M | re.S).search(text, start)
    assert found, f"no {language} block after {heading} in {page}"
    return found.group(1)


def blocks(page: str, language: str) -> list[str]:
    """Every `language` code block of `page`, in order."""
    text = (ROOT / page).read_text(encoding="utf-8")
    return re.compile(rf"^```{language}\n(.*?)^```", re.M | re.S).findall(text)


def commands(text: str) -> list[str]:
    """A block's commands, without their comments."""
    lines = (line.split("#", 1)[0].strip() for line in text.splitlines())
    return [line for line in lines if line]


def shims(folder: Path) -> dict[str, str]:
    """`opd` on PATH as this checkout's, run by this interpreter: the environment to use."""
    bin_dir = folder / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    opd = bin_dir / "opd"
    opd.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m opd.cli "$@"\n')
    opd.chmod(0o755)
    env = os.environ | {"PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": str(ROOT)}
    for name in ("OPD_HOME", "OPD_URL", "OPD_API_KEY", "OPD_DATABASE_URL", "OPD_REDIS_URL"):
        env.pop(name, None)
    return env


def test_the_first_screen_is_the_demo_and_the_test_suite():
    assert commands(block(None, "bash")) == ["scripts/demo.sh", "scripts/test.sh"]


def test_the_first_screens_demo_runs_as_written(tmp_path):
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    for name in ("scripts", "examples"):
        (checkout / name).symlink_to(ROOT / name)
    venv = checkout / ".venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").write_text(
        '#!/bin/sh\n[ "$1 $2" = "-m pip" ] && { echo "pip: nothing to install here"; exit 0; }\n'
        f'exec "{sys.executable}" "$@"\n'
    )
    (venv / "opd").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m opd.cli "$@"\n')
    for shim in venv.iterdir():
        shim.chmod(0o755)
    spec = yaml.safe_load((ROOT / "examples" / "arith.yaml").read_text())
    spec["loop"]["steps"] = 2
    spec["eval"] |= {"every": 1, "holdout": 8}
    short = tmp_path / "demo.yaml"
    short.write_text(yaml.safe_dump(spec))
    (command,) = [c for c in commands(block(None, "bash")) if "demo" in c]

    done = subprocess.run(
        ["bash", "-c", f'{command} --demo-spec "$0" --port "$1"', short, str(free_port())],
        cwd=checkout,
        env=shims(tmp_path) | {"PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=600,
    )

    assert done.returncode == 0, done.stdout + done.stderr
    promised = re.search(r"`(held-out accuracy: student .*?)`", README)
    assert promised, "the first screen quotes the demo's last line"
    shape = re.escape(promised.group(1))
    shape = re.sub(r"\d+", r"\\d+", shape)
    assert re.search(rf"^{shape}$", done.stdout, re.M), done.stdout
    assert "held-out accuracy at step 1: " in done.stdout
    assert (checkout / ".opd" / "api-key").is_file()


def test_opd_run_as_written(tmp_path):
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    (command,) = commands(block("# The demo and `opd run`", "bash", "docs/get-started/demo.md"))

    done = subprocess.run(
        ["bash", "-c", command],
        cwd=tmp_path,
        env=shims(tmp_path / "shims"),
        capture_output=True,
        text=True,
        timeout=600,
    )

    assert done.returncode == 0, done.stdout + done.stderr
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    spec = yaml.safe_load((ROOT / "examples" / "tiny.yaml").read_text())
    assert len(lines) == spec["loop"]["steps"] + 1  # each step and the eval after the last
    assert "Saved weights: " in done.stdout


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, str]]]:
    """`opd serve` started in a folder of its own, as the docs start it: (the folder,
    the environment its examples run in, with the service's port where they say 8000)."""
    with serving(tmp_path_factory.mktemp("readme")) as running:
        yield running


@contextmanager
def serving(folder: Path) -> Iterator[tuple[Path, dict[str, str]]]:
    (folder / "examples").symlink_to(ROOT / "examples")
    env = shims(folder / "shims")
    port = free_port()
    log = (folder / "serve.log").open("wb")
    process = subprocess.Popen(
        ["opd", "serve", "--port", str(port)], cwd=folder, env=env, stdout=log, stderr=log
    )
    try:
        wait_until(lambda: ready(port), "opd serve", process)
        yield folder, env | {"PORT": str(port)}
    finally:
        process.terminate()
        process.wait(120)


def ready(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).is_success
    except httpx.TransportError:
        return False


def test_the_http_apis_curl_session_as_written(served):
    folder, env = served
    session = block("# The HTTP API", "bash", "docs/how-to/http-api.md").replace(
        DEFAULT_API, f"127.0.0.1:{env['PORT']}"
    )
    # Each answer's status on stderr, and every curl's exit status: the session as written
    # on stdout, which the page's comments describe.
    watch = 'curl() { command curl -w "%{stderr}HTTP %{http_code}\\n" "$@"; echo "exit $?" >&2; }\n'

    done = subprocess.run(
        ["bash", "-c", watch + session],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )

    exits = re.findall(r"^exit (\d+)$", done.stderr, re.M)
    statuses = [int(code) for code in re.findall(r"^HTTP (\d+)$", done.stderr, re.M)]
    assert len(exits) == session.count("curl -s") and set(exits) == {"0"}, done.stderr
    assert statuses and all(status < 500 for status in statuses), done.stderr
    created, _ = json.JSONDecoder().raw_decode(done.stdout)
    assert created["id"] == 1 and created["status"] == "queued"  # as the comment says
    assert statuses[0] == 201 and statuses.count(200) >= 10, statuses


def test_the_sdks_example_as_written(served):
    folder, env = served
    example = block("# The Python SDK", "python", "docs/how-to/sdk.md")
    key = (folder / ".opd" / "api-key").read_text().strip()
    url = f"http://127.0.0.1:{env['PORT']}"

    done = subprocess.run(
        [sys.executable, "-c", example],
        cwd=folder,
        env=env | {"OPD_URL": url, "OPD_API_KEY": key},
        capture_output=True,
        text=True,
        timeout=600,
    )

    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[-1] == "404 not_found job 1000000 not found"
    assert (folder / "final.tar.gz").is_file()


def test_the_first_job_tutorial_as_written(tmp_path):
    """docs/get-started/first-job.md's commands, one after another in one shell, against
    `opd serve` started as the page starts it: each command succeeds, and what the page
    says each one makes is there."""
    script = "set -euo pipefail\n" + "\n".join(blocks("docs/get-started/first-job.md", "bash"))
    with serving(tmp_path) as (folder, env):
        url = f"http://127.0.0.1:{env['PORT']}"
        done = subprocess.run(
            ["bash", "-c", script],
            cwd=folder,
            env=env | {"OPD_URL": url},
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert re.search(r"^export OPD_API_KEY", script, re.M), "the page makes a team key first"
        admin = (folder / ".opd" / "api-key").read_text().strip()
        jobs: dict[str, list[dict]] = {}

        def trials_made() -> bool:  # the sweep's controller makes its trials as it goes
            listed = httpx.get(
                f"{url}/v1/jobs", headers={"Authorization": f"Bearer {admin}"}, timeout=10
            ).json()["data"]
            jobs.clear()
            for job in listed:
                jobs.setdefault(job["name"], []).append(job)
            return sum(name.startswith("sums-lr-") for name in jobs) == 2  # sweep-name-N

        wait_until(trials_made, "the sweep's two trials")
    assert [job["status"] for job in jobs["sums"]] == ["succeeded", "succeeded"]  # and its clone
    assert (folder / "sums-model" / "config.json").is_file()
    assert "--- checkpoint (" in done.stdout and "--- teacher (" in done.stdout  # the playground
    served = (folder / "serve.log").read_text()  # on another port than the default, it says
    assert f"export OPD_URL=http://127.0.0.1:{env['PORT']}" in served
