"""Metric curves and the live metric stream of a job."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
from sqlalchemy import event

from app.jobs.store import claim_job, complete_job, stop_job
from app.main import create_app
from app.records.store import record_eval, record_step
from tests.app.conftest import auth, small_spec

WORKER = "worker-1"


async def run_steps(session, job_id: int, steps: range) -> None:
    await claim_job(session, job_id, WORKER, heartbeat_timeout=60)
    for step in steps:
        metrics = {"opd/reverse_kl_mean": step / 10, "data/datums": 4.0}
        if step % 2 == 0:
            metrics["eval/score"] = float(step)
        await record_step(session, job_id, WORKER, step, metrics)


async def test_curves_per_key_in_step_order(client, key, submit, session):
    job = await submit(loop={"steps": 10})
    await run_steps(session, job["id"], range(10))
    response = await client.get(f"/v1/jobs/{job['id']}/metrics", headers=auth(key))
    assert response.status_code == 200
    body = response.json()
    assert body["job_id"] == job["id"]
    assert set(body["curves"]) == {"opd/reverse_kl_mean", "data/datums", "eval/score"}
    kl = body["curves"]["opd/reverse_kl_mean"]
    assert kl["steps"] == list(range(10))
    assert kl["values"] == [step / 10 for step in range(10)]
    assert body["curves"]["eval/score"]["steps"] == [0, 2, 4, 6, 8], "only steps that have it"


async def test_keys_step_range_and_downsampling(client, key, submit, session):
    job = await submit(loop={"steps": 50})
    await run_steps(session, job["id"], range(50))
    response = await client.get(
        f"/v1/jobs/{job['id']}/metrics",
        params={
            "keys": "opd/reverse_kl_mean, missing/metric",
            "from_step": 5,
            "to_step": 45,
            "max_points": 5,
        },
        headers=auth(key),
    )
    body = response.json()
    curves = body["curves"]
    assert set(curves) == {"opd/reverse_kl_mean", "missing/metric"}
    assert curves["opd/reverse_kl_mean"]["steps"] == [5, 45], "a rising curve: min first, max last"
    assert curves["missing/metric"] == {"steps": [], "values": []}
    assert body["downsampling"] == {
        "method": "minmax",
        "first_step": 5,
        "last_step": 45,
        "buckets": 1,
        "bucket_steps": 41,
    }


async def test_a_spike_survives_downsampling_with_first_and_last_points(
    client, key, submit, session
):
    job = await submit(loop={"steps": 300})
    await claim_job(session, job["id"], WORKER, heartbeat_timeout=60)
    for step in range(300):
        kl = 40.0 if step == 137 else 1.0 + (step % 3) / 100
        await record_step(session, job["id"], WORKER, step, {"opd/reverse_kl_mean": kl})
    url = f"/v1/jobs/{job['id']}/metrics"
    for params, first, last in [({}, 0, 299), ({"from_step": 3, "to_step": 250}, 3, 250)]:
        body = (await client.get(url, params=params | {"max_points": 20}, headers=auth(key))).json()
        curve = body["curves"]["opd/reverse_kl_mean"]
        assert len(curve["steps"]) <= 20
        assert curve["steps"][0] == first and curve["steps"][-1] == last
        assert curve["values"][curve["steps"].index(137)] == 40.0, "the spike is kept"
        assert body["downsampling"]["method"] == "minmax" and body["downsampling"]["buckets"] == 9
    short = await client.get(url, params={"from_step": 130, "to_step": 139}, headers=auth(key))
    assert short.json()["curves"]["opd/reverse_kl_mean"]["steps"] == list(range(130, 140))
    assert short.json()["downsampling"]["method"] == "none", "a short range is exact"


async def test_polls_are_answered_304_until_a_step_lands_and_finished_curves_are_immutable(
    client, key, submit, session
):
    job = await submit(loop={"steps": 5})
    await run_steps(session, job["id"], range(2))
    url = f"/v1/jobs/{job['id']}/metrics?keys=opd/reverse_kl_mean"
    first = await client.get(url, headers=auth(key))
    tag = first.headers["etag"]
    assert first.headers["cache-control"] == "private, no-cache"
    again = await client.get(url, headers=auth(key) | {"If-None-Match": tag})
    assert again.status_code == 304 and again.content == b""
    assert again.headers["etag"] == tag
    other_query = await client.get(
        url + "&max_points=10", headers=auth(key) | {"If-None-Match": tag}
    )
    assert other_query.status_code == 200, "the ETag names the query too"

    await record_step(session, job["id"], WORKER, 2, {"opd/reverse_kl_mean": 0.2})
    fresh = await client.get(url, headers=auth(key) | {"If-None-Match": tag})
    assert fresh.status_code == 200 and fresh.headers["etag"] != tag
    assert fresh.json()["curves"]["opd/reverse_kl_mean"]["steps"] == [0, 1, 2]

    tag = fresh.headers["etag"]
    await record_eval(session, job["id"], WORKER, 5, {"opd/reverse_kl_mean": 0.1})
    evaluated = await client.get(url, headers=auth(key) | {"If-None-Match": tag})
    assert evaluated.status_code == 200, "the final eval is a new point"

    await complete_job(session, job["id"], WORKER, "/weights/final")
    done = await client.get(url, headers=auth(key))
    assert done.headers["cache-control"] == "private, max-age=31536000, immutable"


async def test_bad_metric_queries_are_422(client, key, submit):
    job = await submit()
    url = f"/v1/jobs/{job['id']}/metrics"
    cases = [
        ({"max_points": 1}, "max_points"),
        ({"keys": " , "}, "keys"),
        ({"keys": "a,,b"}, "keys"),
        ({"keys": ",".join(f"m{i}" for i in range(101))}, "keys"),
        ({"from_step": -1}, "from_step"),
    ]
    for params, param in cases:
        response = await client.get(url, params=params, headers=auth(key))
        assert response.status_code == 422, params
        assert response.json()["error"]["param"] == param
    inverted = await client.get(url, params={"from_step": 5, "to_step": 2}, headers=auth(key))
    assert inverted.status_code == 200  # an empty range, as the document allows
    assert inverted.json()["downsampling"]["first_step"] is None


async def test_a_replayed_step_shows_once_with_its_new_values(client, key, submit, session):
    job = await submit(loop={"steps": 5})
    await run_steps(session, job["id"], range(3))
    await record_step(session, job["id"], WORKER, 1, {"opd/reverse_kl_mean": 9.0})
    curve = (
        await client.get(
            f"/v1/jobs/{job['id']}/metrics",
            params={"keys": "opd/reverse_kl_mean"},
            headers=auth(key),
        )
    ).json()["curves"]["opd/reverse_kl_mean"]
    assert curve == {"steps": [0, 1, 2], "values": [0.0, 9.0, 0.2]}


def parse_sse(text: str) -> list[dict[str, str]]:
    """Each event's fields; comment lines (keep-alives) are skipped."""
    blocks = [block.splitlines() for block in text.strip().split("\n\n")]
    return [dict(ln.split(": ", 1) for ln in lines if not ln.startswith(":")) for lines in blocks]


async def test_stream_sends_each_step_then_the_end(client, key, submit, session):
    job = await submit(loop={"steps": 3})
    await run_steps(session, job["id"], range(3))
    await complete_job(session, job["id"], WORKER, "/weights/final")
    response = await client.get(f"/v1/jobs/{job['id']}/metrics/stream", headers=auth(key))
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    events = parse_sse(response.text)
    assert [e["event"] for e in events] == ["step", "step", "step", "end"]
    assert [e["id"] for e in events[:3]] == ["0", "1", "2"]
    assert json.loads(events[1]["data"])["metrics"]["opd/reverse_kl_mean"] == 0.1
    assert json.loads(events[3]["data"]) == {"status": "succeeded"}

    resumed = await client.get(
        f"/v1/jobs/{job['id']}/metrics/stream", headers=auth(key) | {"Last-Event-ID": "1"}
    )
    assert [e.get("id") for e in parse_sse(resumed.text)] == ["2", None]


async def test_a_paused_jobs_stream_ends_like_a_finished_ones(client, key, submit, session):
    job = await submit(loop={"steps": 5})
    await run_steps(session, job["id"], range(2))
    await client.post(f"/v1/jobs/{job['id']}/pause", headers=auth(key))
    await stop_job(session, job["id"], WORKER, reason="pause", state_path="/s/1", state_step=1)
    async with asyncio.timeout(60):  # without the end, the stream would never stop
        response = await client.get(f"/v1/jobs/{job['id']}/metrics/stream", headers=auth(key))
    events = parse_sse(response.text)
    assert [e.get("id") for e in events] == ["0", "1", None]
    assert json.loads(events[-1]["data"]) == {"status": "paused"}


async def test_stream_follows_a_running_job(client, key, submit, sessions):
    job = await submit(loop={"steps": 4})

    async def worker() -> None:
        async with sessions() as session:
            await claim_job(session, job["id"], WORKER, heartbeat_timeout=60)
            for step in range(4):
                await asyncio.sleep(0.1)
                await record_step(session, job["id"], WORKER, step, {"opd/reverse_kl_mean": 1.0})
            await complete_job(session, job["id"], WORKER, "/weights/final")

    stream, _ = await asyncio.gather(
        client.get(f"/v1/jobs/{job['id']}/metrics/stream", headers=auth(key)), worker()
    )
    events = parse_sse(stream.text)
    assert [e.get("id") for e in events] == ["0", "1", "2", "3", None]
    assert events[-1]["event"] == "end"


async def test_dashboards_polling_one_job_share_one_read_per_change(settings, key, session):
    app = create_app(settings)
    statements: list[str] = []

    def count(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        statements.append(statement)

    def curve_reads() -> list[str]:
        return [s for s in statements if "step_metrics" in s or "metric_summaries" in s]

    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://opd") as http,
    ):
        body = small_spec(loop={"steps": 10})
        job = (await http.post("/v1/jobs", json=body, headers=auth(key))).json()
        await run_steps(session, job["id"], range(3))
        url = f"/v1/jobs/{job['id']}/metrics?keys=opd/reverse_kl_mean"
        event.listen(app.state.engine.sync_engine, "before_cursor_execute", count)
        first = await http.get(url, headers=auth(key))
        assert curve_reads(), "the first poll reads the curves"
        statements.clear()
        second = await http.get(url, headers=auth(key))
        assert second.content == first.content and curve_reads() == [], "the next one does not"
        await record_step(session, job["id"], WORKER, 3, {"opd/reverse_kl_mean": 0.3})
        third = await http.get(url, headers=auth(key))
        assert third.json()["curves"]["opd/reverse_kl_mean"]["steps"] == [0, 1, 2, 3]
        assert curve_reads(), "a new step means a new read"
        event.remove(app.state.engine.sync_engine, "before_cursor_execute", count)
