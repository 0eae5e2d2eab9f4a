"""A newcomer's first hour through the command line of the bare install (`pip install
opd-service`: the SDK and the client commands alone) against a running service: every `opd`
command's example, the one its `--help` ends with and the reference page shows, run as
written in the order a newcomer takes them, on the ids a new service gives; the admin
commands over HTTP with an admin key; the server's commands naming the extra they need; and
the SDK page's example as pasted. Before, `opd compare 1 2` crashed, the admin commands
asked for sqlalchemy, a cost budget was refused for the shell's want of prices, `opd jobs |
head` ended in a BrokenPipeError (tests/opd/cli/test_errors.py) and the SDK example needed
pandas."""

from __future__ import annotations

import argparse
import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from opd.cli.entry import build_parser
from tests.e2e.conftest import ROOT, Service, deployment, run_light, team_key
from tests.e2e.test_readme import block

WALK = [
    "webhooks create",  # before job 1 ends, so that its job.succeeded is delivery 1
    "jobs create",  # job 1
    "watch",
    "status",
    "jobs",
    "jobs list",
    "events",
    "checkpoints",
    "metrics",
    "samples",
    "playground",
    "feedback list",  # after the test stores a chat completion of job 1 (store: true)
    "feedback show",
    "feedback give",
    "feedback rm",
    "export",
    "clone",  # job 2
    "pause",
    "resume",
    "cancel",
    "compare",
    "files upload",  # file-1
    "files list",
    "files show",
    "files download",
    "files rm",
    "sweeps create",  # sweep 1
    "sweeps list",
    "sweeps status",
    "sweeps cancel",
    "usage",
    "audit",
    "webhooks list",
    "webhooks deliveries",
    "webhooks resend",
    "webhooks delete",
]
"""The client commands, in a newcomer's order, each run as its example says."""
ADMIN_WALK = ["keys create", "keys list", "keys revoke", "teams list", "teams set", "teams budget"]
"""The admin commands, over HTTP with an admin key (OPD_URL and OPD_API_KEY)."""
SERVER = ["run", "serve", "api", "worker", "migrate", "rotate-secrets"]
"""What the bare install cannot run: each says which extra to install (the suite runs them in
the full install: test_readme.py, test_service.py, tests/opd/cli/)."""
NOT_WALKED = {
    "vllm setup": "builds vLLM's own environment (3.5 GB): tests/opd/cli/test_vllm.py",
    "vllm serve": "needs that environment: tests/opd/cli/test_vllm.py, tests/e2e/test_vllm.py",
}
PRICES = [
    {"backend": "local", "model": name, "sampled": 0.1, "scored": 0.1, "trained": 0.2, "eval": 0.1}
    for name in ("tiny-student", "tiny-teacher")
]
TRAIN = [{"question": f"What is {n} + {n}?", "answer": str(2 * n)} for n in range(1, 9)]


def examples() -> dict[str, str]:
    """Every command's example by its command path (`files upload`), from the parser; the
    deprecated names, whose examples are their new names', are left out."""
    found: dict[str, str] = {}

    def walk(parser: argparse.ArgumentParser, path: list[str]) -> None:
        if parser._defaults.get("renamed"):
            return
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if path and not (subs and subs[0].required):
            name = " ".join(path)
            assert parser.epilog and parser.epilog.startswith("example: "), f"opd {name}"
            found[name] = parser.epilog.removeprefix("example: ")
        for sub in subs:
            for child, subparser in sub.choices.items():
                walk(subparser, [*path, child])

    walk(build_parser(), [])
    return found


def store_a_chat(service: Service, model: str, topic: str) -> str:
    """A chat completion the service keeps (`store: true`), as an OpenAI client sends it:
    what `opd feedback` lists and rates."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "What is 2 + 2?"}],
        "max_tokens": 4,
        "store": True,
        "metadata": {"topic": topic},
    }
    headers = {"Authorization": f"Bearer {service.key}"}
    url = f"{service.url}/v1/chat/completions"
    answer = httpx.post(url, json=body, headers=headers, timeout=60)
    assert answer.status_code == 200, answer.text
    return answer.json()["id"]


def test_every_command_has_an_example_and_the_walk_takes_each():
    documented = examples()
    assert set(documented) == {*WALK, *ADMIN_WALK, *SERVER, *NOT_WALKED}


@pytest.fixture
def newcomer(tmp_path: Path, database_url: str) -> Iterator[tuple[Service, Path, str]]:
    """A running service (API and one worker, prices set, webhooks to any address) and a
    folder with the checkout's examples (the tiny job cut to 4 steps) and a dataset."""
    home = tmp_path / "service"
    home.mkdir()
    settings = {"prices": json.dumps(PRICES), "webhook_allow_private": "true"}
    with deployment(home, database_url, **settings) as service:
        service.start_worker()
        admin = team_key(home, database_url, "ops", scope="admin")
        folder = tmp_path / "newcomer"
        shutil.copytree(ROOT / "examples", folder / "examples")
        tiny = yaml.safe_load((folder / "examples" / "tiny.yaml").read_text())
        tiny["loop"]["steps"], tiny["eval"]["every"] = 4, 2
        (folder / "examples" / "tiny.yaml").write_text(yaml.safe_dump(tiny))
        (folder / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in TRAIN))
        yield service, folder, admin


def test_a_newcomers_first_hour_in_the_bare_install(light_venv, newcomer):
    service, folder, admin = newcomer
    documented = examples()
    team = {"OPD_URL": service.url, "OPD_API_KEY": service.key}

    def opd(command: str, key: str = service.key) -> tuple[int, str, str]:
        done = run_light(
            light_venv, "bash", "-c", command, cwd=folder, OPD_URL=service.url, OPD_API_KEY=key
        )
        return done.returncode, done.stdout, done.stderr

    stored = None
    for name in WALK:
        command = documented[name]
        if name == "feedback list":
            stored = store_a_chat(service, "job-1", "arithmetic")
        if "COMPLETION" in command:
            assert stored is not None
            command = command.replace("COMPLETION", stored)
        code, out, err = opd(command)
        assert code == 0 and "error:" not in err, (name, out, err, service.logs())
        if name == "feedback list":
            assert out.startswith(f"{stored}  job-1  "), out
        if name == "feedback give":
            assert f"on {stored}" in out, out
        if name == "compare":
            assert "optim.learning_rate" in out and "0.002" in out, out
        if name == "export":
            card = (folder / "job-1-final" / "README.md").read_text()
            assert "trained by on-policy distillation" in card

    created = None
    for name in ADMIN_WALK:
        command = documented[name]
        if "PREFIX" in command:
            assert created is not None
            command = command.replace("PREFIX", created.split("_")[1])
        code, out, err = opd(command, admin)
        assert code == 0 and "error:" not in err, (name, out, err)
        if name == "keys create":
            created = out.strip()
            assert f"by the service at {service.url}" in err
    code, out, err = opd("opd teams budget beta --cost 0.05", admin)
    assert code == 0 and "team beta: 0.00 of 0.05 this month" in out, (out, err)

    for name in SERVER:
        code, _, err = opd(documented[name])
        assert code == 1 and "pip install 'opd-service[" in err and "Traceback" not in err, err

    code, out, err = opd("opd metrics 1 --keys reverse_kl")
    assert code == 1 and "did you mean" in err and "`opd/reverse_kl_mean`" in err, err
    example = block("# The Python SDK", "python", "docs/how-to/sdk.md")
    done = run_light(light_venv, "python", "-c", example, cwd=folder, **team)
    assert done.returncode == 0, done.stderr
    assert re.search(r"^404 not_found job 1000000 not found$", done.stdout, re.M), done.stdout
