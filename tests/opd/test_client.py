"""The HTTP client's requests as they leave it."""

from __future__ import annotations

import json

import httpx

from kernel.spec import parse_spec
from opd.client import OPDClient


def test_submit_sends_the_spec_as_written_so_a_retry_survives_an_upgrade():
    sent: list[dict] = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content))
        return httpx.Response(201, json={"id": 1})

    client = OPDClient("http://opd", "key")
    client.http = httpx.Client(base_url="http://opd", transport=httpx.MockTransport(answer))
    written = {"name": "mine", "loop": {"steps": 3}}
    client.submit(parse_spec(written), "retry-1")
    assert sent == [written], "defaults are the service's to fill, not part of the request"
