"""The doors stay at parity: every route of the API has an SDK method that sends it, and
every route a person uses by hand has an `opd` command that sends it. A route added without
them (or a method or command that drifts to another route) fails here; the few routes that
are not for people are exempted below, each with its reason."""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.routing import BaseRoute

from app.core.config import Settings
from app.main import create_app
from app.playground.schemas import PlaygroundRequest
from opd.cli import common, main
from opd.sdk import Client
from opd.sdk.client import Resources
from opd.sdk.resources.jobs import Jobs
from opd.sdk.transport import Call, Listing

Route = tuple[str, str]
"""(method, path template), as FastAPI names a route."""

NOT_FOR_PEOPLE = {
    ("GET", "/openapi.json"): "the OpenAPI document itself",
    ("GET", "/docs"): "the document's viewer",
    ("GET", "/docs/oauth2-redirect"): "the document's viewer",
    ("GET", "/redoc"): "the document's viewer",
    ("GET", "/healthz"): "a load balancer's probe",
    ("GET", "/readyz"): "a load balancer's probe",
    ("GET", "/metrics"): "Prometheus scrapes it",
    ("POST", "/v1/chat/completions"): "the OpenAI door: the openai package is its SDK",
    ("POST", "/v1/completions"): "the OpenAI door: the openai package is its SDK",
    ("GET", "/v1/models"): "the OpenAI door: the openai package is its SDK",
    ("GET", "/v1/models/{model}"): "the OpenAI door: the openai package is its SDK",
    **{
        (method, f"/v1/fine_tuning/jobs{path}"): "the OpenAI door: the openai package is its "
        "SDK (opd's jobs.* reach the same jobs)"
        for method, path in [
            ("POST", ""),
            ("GET", ""),
            ("GET", "/{fine_tuning_job_id}"),
            ("POST", "/{fine_tuning_job_id}/cancel"),
            ("POST", "/{fine_tuning_job_id}/pause"),
            ("POST", "/{fine_tuning_job_id}/resume"),
            ("GET", "/{fine_tuning_job_id}/events"),
            ("GET", "/{fine_tuning_job_id}/checkpoints"),
        ]
    },
    ("POST", "/v1/jobs/{job_id}/sample"): "the old name of /playground (one release)",
    ("GET", "/v1/jobs/{job_id}/metrics/stream"): "Server-Sent Events for the dashboard's "
    "live charts; jobs.wait and opd watch follow a job by polling /metrics",
}
"""Routes with neither an SDK method nor a command, and why."""
PAGES = ("/ui", "/")
"""The dashboard's pages (and its static files): a browser's door, not an API route."""


@dataclass(frozen=True)
class Door:
    """How the SDK (and, unless `cli` is None, the CLI) reaches one route."""

    sdk: Callable[[Any], Any]
    cli: list[str] | None
    why_no_cli: str = ""
    cli_first: Route | None = None
    """The route the command sends first, when it reads something before it (export
    finds the checkpoint's id before it downloads it)."""
    operator: bool = field(default=False)
    """The command works on the database directly (an operator's, on the API's machine)."""


SPEC = {
    "backend": "local",
    "student": {"base_model": "tiny-student"},
    "teacher": {"base_model": "tiny-teacher"},
    "dataset": {"source": "inline", "prompts": ["What is 2 + 3?"]},
}
DOORS: dict[Route, Door] = {
    ("POST", "/v1/jobs"): Door(lambda o: o.jobs.create(SPEC), ["jobs", "create", "SPEC"]),
    ("GET", "/v1/jobs"): Door(lambda o: o.jobs.list(name="x"), ["jobs", "list"]),
    ("GET", "/v1/jobs/{job_id}"): Door(lambda o: o.jobs.get(1), ["status", "1"]),
    ("POST", "/v1/jobs/{job_id}/cancel"): Door(lambda o: o.jobs.cancel(1), ["cancel", "1"]),
    ("POST", "/v1/jobs/{job_id}/pause"): Door(lambda o: o.jobs.pause(1), ["pause", "1"]),
    ("POST", "/v1/jobs/{job_id}/resume"): Door(lambda o: o.jobs.resume(1), ["resume", "1"]),
    ("GET", "/v1/jobs/{job_id}/metrics"): Door(
        lambda o: o.jobs.metrics(1), ["watch", "1"], cli_first=("GET", "/v1/jobs/{job_id}")
    ),
    ("GET", "/v1/jobs/{job_id}/metrics/export"): Door(lambda o: o.jobs.export(1), ["metrics", "1"]),
    ("GET", "/v1/metrics"): Door(
        lambda o: o.jobs.compare([1, 2]),
        None,
        "curves of several jobs are charts: the dashboard's compare page draws them",
    ),
    ("GET", "/v1/jobs/{job_id}/checkpoints"): Door(
        lambda o: o.jobs.checkpoints(1), ["checkpoints", "1"]
    ),
    ("GET", "/v1/jobs/{job_id}/events"): Door(lambda o: o.jobs.events(1), ["events", "1"]),
    ("GET", "/v1/jobs/{job_id}/samples"): Door(lambda o: o.jobs.samples(1), ["samples", "1"]),
    ("POST", "/v1/jobs/{job_id}/playground"): Door(
        lambda o: o.jobs.playground(1, "2 + 3?"), ["playground", "1", "2 + 3?"]
    ),
    ("POST", "/v1/jobs/{job_id}/clone"): Door(lambda o: o.jobs.clone(1, {}), ["clone", "1"]),
    ("GET", "/v1/jobs/{job_id}/checkpoints/{checkpoint_id}/download"): Door(
        lambda o: o.jobs.download(1, 2, "x.tar.gz"),
        ["export", "1", "OUT"],
        cli_first=("GET", "/v1/jobs/{job_id}/checkpoints"),
    ),
    ("GET", "/v1/usage"): Door(lambda o: o.usage.get(since=date(2026, 1, 1)), ["usage"]),
    ("GET", "/v1/audit"): Door(lambda o: o.audit.list(), ["audit"]),
    ("POST", "/v1/webhooks"): Door(
        lambda o: o.webhooks.create("https://example.com", ["job.failed"]),
        ["webhooks", "create", "https://example.com", "--event", "job.failed"],
    ),
    ("GET", "/v1/webhooks"): Door(lambda o: o.webhooks.list(), ["webhooks", "list"]),
    ("GET", "/v1/webhooks/{webhook_id}"): Door(
        lambda o: o.webhooks.get(1), None, "`opd webhooks list` shows each webhook whole"
    ),
    ("DELETE", "/v1/webhooks/{webhook_id}"): Door(
        lambda o: o.webhooks.delete(1), ["webhooks", "delete", "1"]
    ),
    ("GET", "/v1/webhooks/{webhook_id}/deliveries"): Door(
        lambda o: o.webhooks.deliveries(1), ["webhooks", "deliveries", "1"]
    ),
    ("GET", "/v1/webhooks/{webhook_id}/deliveries/{delivery_id}"): Door(
        lambda o: o.webhooks.delivery(1, 2),
        None,
        "one delivery's attempt log: `opd webhooks deliveries` shows each one's last error",
    ),
    ("POST", "/v1/webhooks/{webhook_id}/deliveries/{delivery_id}/resend"): Door(
        lambda o: o.webhooks.resend(1, 2), ["webhooks", "resend", "1", "2"]
    ),
    ("GET", "/v1/teams"): Door(lambda o: o.teams.list(), ["teams", "list"], operator=True),
    ("PATCH", "/v1/teams/{name}"): Door(
        lambda o: o.teams.update("a", max_running=1),
        ["teams", "set", "a", "--max-running", "1"],
        operator=True,
    ),
    ("POST", "/v1/jobs/estimate"): Door(
        lambda o: o.jobs.estimate(SPEC), ["jobs", "create", "SPEC", "--estimate"]
    ),
    ("POST", "/v1/sweeps/estimate"): Door(
        lambda o: o.sweeps.estimate({"base": SPEC, "parameters": {}}),
        None,
        "a sweep's estimate is for a program that plans many; the dashboard's form shows it",
    ),
    ("GET", "/v1/teams/{team}/budget"): Door(
        lambda o: o.teams.budget("a"), ["teams", "budget", "a"], operator=True
    ),
    ("PUT", "/v1/teams/{team}/budget"): Door(
        lambda o: o.teams.set_budget("a", tokens=1000),
        ["teams", "budget", "a", "--tokens", "1000"],
        operator=True,
    ),
    ("DELETE", "/v1/teams/{team}/budget"): Door(
        lambda o: o.teams.delete_budget("a"), ["teams", "budget", "a", "--remove"], operator=True
    ),
    ("GET", "/v1/keys"): Door(lambda o: o.keys.list(), ["keys", "list"], operator=True),
    ("POST", "/v1/keys"): Door(
        lambda o: o.keys.create("a"), ["keys", "create", "--team", "a"], operator=True
    ),
    ("DELETE", "/v1/keys/{prefix}"): Door(
        lambda o: o.keys.revoke("1a2b"), ["keys", "revoke", "1a2b"], operator=True
    ),
    ("POST", "/v1/files"): Door(
        lambda o: o.files.upload(Path(__file__), progress=False),
        ["files", "upload", "SPEC", "--quiet"],
    ),
    ("GET", "/v1/files"): Door(lambda o: o.files.list(), ["files", "list"]),
    ("GET", "/v1/files/{file_id}"): Door(
        lambda o: o.files.get("file-1"), ["files", "show", "file-1"]
    ),
    ("GET", "/v1/files/{file_id}/content"): Door(
        lambda o: o.files.download("file-1", "x.jsonl"), ["files", "download", "file-1", "OUT"]
    ),
    ("DELETE", "/v1/files/{file_id}"): Door(
        lambda o: o.files.delete("file-1"), ["files", "rm", "file-1"]
    ),
    ("POST", "/v1/sweeps"): Door(lambda o: o.sweeps.create({}), ["sweeps", "create", "SWEEP"]),
    ("GET", "/v1/sweeps"): Door(lambda o: o.sweeps.list(), ["sweeps", "list"]),
    ("GET", "/v1/sweeps/{sweep_id}"): Door(lambda o: o.sweeps.get(1), ["sweeps", "status", "1"]),
    ("POST", "/v1/sweeps/{sweep_id}/cancel"): Door(
        lambda o: o.sweeps.cancel(1), ["sweeps", "cancel", "1"]
    ),
    ("GET", "/v1/chat/completions"): Door(
        lambda o: o.stored_completions.list(rating=-1), ["feedback", "list", "--rating", "-1"]
    ),
    ("GET", "/v1/chat/completions/{completion_id}"): Door(
        lambda o: o.stored_completions.get("chatcmpl-1"), ["feedback", "show", "chatcmpl-1"]
    ),
    ("GET", "/v1/chat/completions/{completion_id}/messages"): Door(
        lambda o: o.stored_completions.messages("chatcmpl-1"),
        None,
        "`opd feedback show` prints the conversation",
    ),
    ("POST", "/v1/chat/completions/{completion_id}"): Door(
        lambda o: o.stored_completions.update("chatcmpl-1", {"topic": "a"}),
        None,
        "metadata labels what a program sends; the SDK and the openai package set it",
    ),
    ("DELETE", "/v1/chat/completions/{completion_id}"): Door(
        lambda o: o.stored_completions.delete("chatcmpl-1"), ["feedback", "rm", "chatcmpl-1"]
    ),
    ("POST", "/v1/chat/completions/{completion_id}/feedback"): Door(
        lambda o: o.stored_completions.feedback("chatcmpl-1", rating=1),
        ["feedback", "give", "chatcmpl-1", "--rating", "1"],
    ),
}


def leaves(routes: list[BaseRoute]) -> Iterator[BaseRoute]:
    """Every route, through the routers FastAPI includes."""
    for route in routes:
        inner = getattr(route, "original_router", None)
        yield from leaves(inner.routes) if inner is not None else [route]


def api_routes(tmp_path: Path) -> set[Route]:
    app = create_app(Settings(home=tmp_path, migrate_on_start=False))
    found = set()
    for route in leaves(app.routes):
        path = getattr(route, "path", "")
        if path == "/" or path.startswith(PAGES[0]):
            continue
        for method in getattr(route, "methods", None) or ():
            if method != "HEAD":
                found.add((method, path))
    return found


def matches(route: Route, method: str, path: str) -> bool:
    pattern = re.sub(r"\{[^}]+\}", "[^/]+", route[1])
    return route[0] == method and re.fullmatch(pattern, path) is not None


class Sent(Exception):
    """What stops an operation once it has said the first request it sends."""


class Recorder:
    """A transport that records the first request of an operation and sends nothing."""

    def __init__(self) -> None:
        self.calls: list[Call] = []

    def run(self, steps: Any) -> Any:
        self.calls.append(next(steps))
        raise Sent

    def iterate(self, listing: Listing) -> Iterator[Any]:
        self.calls.append(listing.call)
        raise Sent


def test_every_route_is_mapped_or_exempted_with_a_reason(tmp_path):
    routes = api_routes(tmp_path)
    unmapped = routes - DOORS.keys() - NOT_FOR_PEOPLE.keys()
    assert not unmapped, f"routes with no SDK method or command (add them to DOORS): {unmapped}"
    gone = (DOORS.keys() | NOT_FOR_PEOPLE.keys()) - routes
    assert not gone, f"DOORS or NOT_FOR_PEOPLE name routes the API no longer has: {gone}"
    assert all(NOT_FOR_PEOPLE.values())
    assert all(door.cli is not None or door.why_no_cli for door in DOORS.values())


@pytest.mark.parametrize("route", sorted(DOORS), ids=" ".join)
def test_the_sdk_method_sends_its_route(route):
    recorder = Recorder()
    with pytest.raises(Sent):
        DOORS[route].sdk(Resources(recorder, Client))  # type: ignore[arg-type]
    (call,) = recorder.calls
    assert matches(route, call.method, call.path), (call.method, call.path)


@pytest.mark.parametrize(
    "route", sorted(r for r, door in DOORS.items() if door.cli is not None), ids=" ".join
)
def test_the_command_sends_its_route(route, tmp_path, monkeypatch, capsys):
    door = DOORS[route]
    assert door.cli is not None
    argv = [str(tmp_path / "file.yaml") if part in ("SPEC", "SWEEP") else part for part in door.cli]
    argv = [str(tmp_path / "out") if part == "OUT" else part for part in argv]
    (tmp_path / "file.yaml").write_text(json.dumps(SPEC))
    if door.operator:  # on the database: it parses, and the command runs on an empty one
        monkeypatch.setenv("OPD_HOME", str(tmp_path))
        monkeypatch.setenv("OPD_DATABASE_URL", f"sqlite:///{tmp_path / 'opd.db'}")
        from app.core.config import get_settings
        from app.core.db import migrate

        get_settings.cache_clear()
        migrate(f"sqlite:///{tmp_path / 'opd.db'}")
        code = main(argv)
        get_settings.cache_clear()
        err = capsys.readouterr().err
        assert code == 0 or err.startswith("error: no "), err  # e.g. no team named 'a'
        return
    sent: list[httpx.Request] = []

    def refuse(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        error = {"error": {"code": "not_found", "message": "a test", "param": None}}
        return httpx.Response(404, json=error)

    monkeypatch.setattr(
        common,
        "Client",
        lambda url, key: Client(url, key, transport=httpx.MockTransport(refuse)),
    )
    assert main([*argv, "--key", "opd_test"]) == 1
    assert capsys.readouterr().err == "error: HTTP 404: a test\n"
    first = door.cli_first or route
    assert sent and matches(first, sent[0].method, sent[0].url.path), sent


def test_the_sdks_playground_takes_every_field_of_the_playgrounds_request():
    taken = set(inspect.signature(Jobs.playground.method).parameters) - {"self", "job_id"}
    assert taken - {"idempotency_key"} == set(PlaygroundRequest.model_fields)
    recorder = Recorder()
    with pytest.raises(Sent):
        Resources(recorder, Client).jobs.playground(  # type: ignore[arg-type]
            1,
            "2 + 3?",
            seed=3,
            stop=["\n"],
            teacher="add",
            model="teacher",
            compare=["base"],
            store=True,
            metadata={"tag": "try"},
        )
    (call,) = recorder.calls
    assert PlaygroundRequest.model_validate(call.json).model_dump(exclude_defaults=True) == {
        "prompt": "2 + 3?",
        "seed": 3,
        "stop": ["\n"],
        "teacher": "add",
        "model": "teacher",
        "compare": ["base"],
        "store": True,
        "metadata": {"tag": "try"},
    }
