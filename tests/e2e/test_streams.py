"""Metric streams (SSE) held open against a real `opd api` process: past its team's bound a
team's next stream is a 429 with Retry-After while another team's still opens, past the
process's bound every team's is; a closed stream gives its place back, and so does the
stream of a job that is paused, which ends like a finished job's."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import Service, deployment, tiny_spec

TEAM_STREAMS, PROCESS_STREAMS = 2, 3

Opener = Callable[[str, dict], httpx.Response]


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    bounds = {"team_max_streams": str(TEAM_STREAMS), "max_streams": str(PROCESS_STREAMS)}
    with deployment(tmp_path, f"sqlite:///{tmp_path / 'opd.db'}", **bounds) as running:
        yield running


def submitted(service: Service, key: str) -> dict:
    """A job that stays queued (no worker runs here), so its stream stays open."""
    headers = {"Authorization": f"Bearer {key}"}
    response = httpx.post(f"{service.url}/v1/jobs", json=tiny_spec(), headers=headers, timeout=30)
    assert response.status_code == 201, response.text
    return response.json()


def refusal(response: httpx.Response) -> str:
    assert response.status_code == 429, response.status_code
    assert response.headers["retry-after"] == "5"
    response.read()
    return response.json()["error"]["message"]


def opened_once_freed(open_stream: Opener, key: str, job: dict) -> httpx.Response:
    """A stream opened as soon as the server has seen a closed one go."""
    deadline = time.monotonic() + 30
    while (response := open_stream(key, job)).status_code == 429:
        assert time.monotonic() < deadline, "the closed stream's place was never given back"
        time.sleep(0.1)
    return response


def test_streams_are_bounded_per_team_and_per_process_and_a_paused_jobs_ends(service):
    other = service.opd("keys", "create", "--team", "other").stdout.strip()
    ours, theirs = submitted(service, service.key), submitted(service, other)
    with httpx.Client(base_url=service.url, timeout=30) as http, ExitStack() as held:

        def open_stream(key: str, job: dict) -> httpx.Response:
            path = f"/v1/jobs/{job['id']}/metrics/stream"
            headers = {"Authorization": f"Bearer {key}"}
            return held.enter_context(http.stream("GET", path, headers=headers))

        first, second = open_stream(service.key, ours), open_stream(service.key, ours)
        assert (first.status_code, second.status_code) == (200, 200)
        message = refusal(open_stream(service.key, ours))
        assert message.startswith("this team already has as many metric streams open")
        assert f"({TEAM_STREAMS}, OPD_TEAM_MAX_STREAMS)" in message

        assert open_stream(other, theirs).status_code == 200, "another team's stream opens"
        message = refusal(open_stream(other, theirs))
        assert f"({PROCESS_STREAMS}, OPD_MAX_STREAMS)" in message, message

        first.close()
        assert opened_once_freed(open_stream, service.key, ours).status_code == 200

        ours_headers = {"Authorization": f"Bearer {service.key}"}
        paused = http.post(f"/v1/jobs/{ours['id']}/pause", headers=ours_headers)
        assert paused.json()["status"] == "paused", paused.text
        second.read()  # the stream ends: the job is paused
        assert second.text.startswith('event: end\ndata: {"status":"paused"}'), second.text
        another = submitted(service, service.key)
        assert open_stream(service.key, another).status_code == 200, "the ended one's place"
