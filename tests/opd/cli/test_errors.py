"""What `opd` says when the API refuses its key, and when a file it reads is no spec or
sweep: each in words that say what to do, naming the file, its line and where a key is
looked up."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from opd.serve import free_port
from tests.opd.cli.test_keys import ROOT, run_opd
from tests.opd.sdk.test_transport import Scripted

REFUSED = (401, {"WWW-Authenticate": "Bearer"})


def missing_key(message: str) -> tuple[int, dict[str, str], dict[str, dict[str, object]]]:
    """The API's own 401 (app/api/deps.py), as the scripted server answers it."""
    return (*REFUSED, {"error": {"code": "unauthorized", "message": message, "param": None}})


@pytest.fixture
def server() -> Iterator[Scripted]:
    """An HTTP server that refuses the first request's key (none) and the second's."""
    scripted = Scripted([missing_key("missing API key"), missing_key("unknown or revoked API key")])
    threading.Thread(target=scripted.serve_forever, daemon=True).start()
    yield scripted
    scripted.shutdown()
    scripted.server_close()


def test_a_401_says_how_to_give_a_key_and_where_the_local_one_is_looked_up(server, tmp_path):
    """Before: `error: HTTP 401: missing API key: send 'Authorization: Bearer KEY' or
    'X-API-Key: KEY'`, which says nothing of OPD_API_KEY or ./.opd/api-key."""
    local = (tmp_path / "api-key").resolve()

    nothing = run_opd("jobs", "--url", server.url, home=tmp_path, OPD_API_KEY="")
    assert nothing.returncode == 1
    assert nothing.stderr == (
        "error: HTTP 401: missing API key\n"
        f"no key was given, and there is none at {local} (where `opd serve` writes one). "
        "Give a key with --key KEY or `export OPD_API_KEY=KEY` (an admin makes one with "
        f"`opd keys create --team NAME`); without either, opd reads {local} "
        "(OPD_HOME/api-key, OPD_HOME defaults to ./.opd)\n"
    )

    local.write_text("stale-key\n")
    stale = run_opd("jobs", "--url", server.url, home=tmp_path, OPD_API_KEY="")
    assert stale.returncode == 1
    assert f"the key in {local} (written by `opd serve`) was refused" in stale.stderr
    (*_, first), (*_, second) = server.received
    assert "Authorization" not in first and second["Authorization"] == "Bearer stale-key"


def test_a_sweep_file_that_is_no_yaml_names_its_line(tmp_path: Path):
    """Before: `sweep.yaml is not valid YAML/JSON: while parsing a block mapping in
    "<unicode string>", line 1, column 1 ...`."""
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text("name: lr\nparameters:\n  - optim.learning_rate\n bad: 1\n")
    broken = run_opd("sweeps", "create", str(sweep), home=tmp_path)
    assert broken.returncode == 1
    assert broken.stderr.startswith(f"error: {sweep}, line 4: not valid YAML: ")
    assert "<unicode string>" not in broken.stderr and "Traceback" not in broken.stderr
    sweep.write_text("")
    empty = run_opd("sweeps", "create", str(sweep), home=tmp_path)
    assert empty.stderr == (
        f"error: {sweep}: a sweep is empty: it must be a mapping of fields (`name: value` lines)\n"
    )


def test_an_api_that_does_not_answer_says_where_it_was_looked_for(tmp_path):
    url = f"http://127.0.0.1:{free_port()}"
    down = run_opd("jobs", "--url", url, home=tmp_path, OPD_API_KEY="k")
    assert down.returncode == 1
    assert f"cannot reach the OPD API at {url}" in down.stderr
    assert "--url or OPD_URL" in down.stderr


CHATTY = """
import argparse, sys
from opd.cli import entry

def build_parser():
    parser = argparse.ArgumentParser(prog="opd")
    parser.set_defaults(handler=lambda args: [print(f"row {n}") for n in range(200_000)] and 0)
    return parser

entry.build_parser = build_parser
sys.exit(entry.main([]))
"""


def test_a_reader_that_goes_away_ends_the_command_quietly():
    """`opd jobs | head -4` ended with `error: BrokenPipeError`: a closed pipe now ends the
    command as SIGPIPE ends one, saying nothing."""
    process = subprocess.Popen(
        [sys.executable, "-c", CHATTY],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=os.environ | {"PYTHONPATH": str(ROOT)},
    )
    assert process.stdout is not None and process.stderr is not None
    assert process.stdout.readline() == b"row 0\n"
    process.stdout.close()  # `head -1` has what it wanted
    status = process.wait(timeout=60)
    assert (status, process.stderr.read()) == (141, b"")
