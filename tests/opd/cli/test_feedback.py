"""`opd feedback list` on the API, on both databases: past the list door's largest page
(100), `--limit` is met by following the pages' cursor, newest first, the filters kept."""

from __future__ import annotations

import asyncio

import httpx
from starlette.testclient import TestClient

from app.main import create_app
from opd.cli import common, main
from opd.sdk import Client
from tests.app.conftest import (  # noqa: F401 (fixtures)
    database_url,
    job,
    key,
    make_key,
    postgres_url,
    queue_name,
    redis,
    session,
    sessions,
    settings,
)
from tests.app.web.test_completion_pages import keep, stored


async def test_the_list_pages_past_a_hundred_to_its_limit(
    settings,  # noqa: F811 (the fixtures)
    session,  # noqa: F811
    key,  # noqa: F811
    make_key,  # noqa: F811
    job,  # noqa: F811
    monkeypatch,
    capsys,
):
    ids = await keep(
        session, *(stored(key.team.id, job.id, n, "job-1", app=str(n % 2)) for n in range(230))
    )
    stranger = await make_key()
    await keep(session, stored(stranger.team.id, job.id, 999, "job-1", app="1"))
    sent: list[httpx.QueryParams] = []

    def run(*args: str) -> list[str]:
        with TestClient(create_app(settings)) as api:

            def forward(request: httpx.Request) -> httpx.Response:
                sent.append(request.url.params)
                answer = api.request(
                    request.method,
                    str(request.url),
                    headers=dict(request.headers),
                    content=request.content,
                )  # the test client's httpx is another package's: its answer, as this one's
                headers = list(answer.headers.multi_items())
                return httpx.Response(answer.status_code, headers=headers, content=answer.content)

            monkeypatch.setattr(
                common,
                "Client",
                lambda url, key: Client(url, key, transport=httpx.MockTransport(forward)),
            )
            assert main(["feedback", "list", *args, "--key", key.key]) == 0
        return [line.split()[0] for line in capsys.readouterr().out.splitlines()]

    newest = ids[::-1]
    assert await asyncio.to_thread(run, "--limit", "150") == newest[:150]
    assert [(p["limit"], p.get("after")) for p in sent] == [("100", None), ("100", newest[99])]
    sent.clear()
    assert await asyncio.to_thread(run, "--limit", "500") == newest
    assert len(sent) == 3 and all(p["order"] == "desc" for p in sent)
    odd = [one for n, one in enumerate(ids) if n % 2][::-1]
    assert await asyncio.to_thread(run, "--limit", "110", "--metadata", "app=1") == odd[:110]
