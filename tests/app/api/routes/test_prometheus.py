"""GET /metrics: Prometheus' own parser reads it; admin-only; bounded labels; what the
database and Redis hold; the separate listen address needs no key."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from app.jobs.store import claim_job
from app.records.store import record_step
from opd.serve import free_port
from tests.app.conftest import CLOSED_REDIS_URL, auth, serve

WORKER = "worker-prom"


def parse(text: str) -> dict[str, list[Sample]]:
    """Samples by sample name (`opd_jobs`, `..._total`, `..._bucket`), as Prometheus' own
    parser reads them."""
    samples: dict[str, list[Sample]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append(sample)
    return samples


def value(families: dict[str, list[Sample]], family: str, **labels: str) -> float:
    matches = [
        s.value
        for s in families[family]
        if all(s.labels.get(name) == wanted for name, wanted in labels.items())
    ]
    assert len(matches) == 1, f"{family}{labels}: {matches}"
    return matches[0]


async def test_metrics_need_an_admin_key(client, key, make_key):
    assert (await client.get("/metrics")).status_code == 401
    assert (await client.get("/metrics", headers=auth(key))).status_code == 403
    admin = await make_key(admin=True)
    response = await client.get("/metrics", headers=auth(admin))
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")


async def test_the_exposition_parses_and_counts_jobs_steps_and_requests(
    client, key, make_key, submit, session
):
    admin = await make_key(admin=True)
    before = parse((await client.get("/metrics", headers=auth(admin))).text)
    running = await submit(loop={"steps": 5})
    await submit()
    await claim_job(session, running["id"], WORKER, heartbeat_timeout=60)
    for step in range(3):
        metrics = {"opd/reverse_kl_mean": 1.0, "time/step_elapsed_time": 0.2 * (step + 1)}
        await record_step(session, running["id"], WORKER, step, metrics)
    for _ in range(2):
        assert (await client.get(f"/v1/jobs/{running['id']}", headers=auth(key))).is_success
    families = parse((await client.get("/metrics", headers=auth(admin))).text)

    def grew(family: str, **labels: str) -> float:
        old = [s for s in before.get(family, []) if s.labels == {**labels}]
        return value(families, family, **labels) - (old[0].value if old else 0.0)

    assert grew("opd_jobs", status="running") == 1
    assert grew("opd_jobs", status="queued") == 1
    assert value(families, "opd_workers_live") >= 1
    assert value(families, "opd_steps_per_second") >= 3 / 60
    assert value(families, "opd_database_up") == 1
    assert value(families, "opd_redis_up") == 1
    assert value(families, "opd_queue_length") >= 1
    step_buckets = {s.labels["le"]: s.value for s in families["opd_step_duration_seconds_bucket"]}
    assert step_buckets["0.25"] >= 1 and step_buckets["0.5"] >= 2 and step_buckets["+Inf"] >= 3
    route = "/v1/jobs/{job_id}"
    assert grew("opd_http_requests_total", method="GET", route=route, status="200") == 2
    latency = [
        s
        for s in families["opd_http_request_duration_seconds_count"]
        if s.labels["route"] == route and s.labels["status"] == "200"
    ]
    assert latency and latency[0].value >= 2


async def test_labels_are_bounded(client, make_key):
    admin = await make_key(admin=True)
    await client.get("/v1/jobs/123456", headers=auth(admin))
    await client.request("BREW", "/no/such/path/42")
    text = (await client.get("/metrics", headers=auth(admin))).text
    assert "123456" not in text, "no job ids in labels"
    assert "/no/such/path" not in text and "BREW" not in text
    families = parse(text)
    assert value(families, "opd_http_requests_total", method="other", route="unmatched") >= 1


async def test_redis_down_shows_as_down_and_counts_queue_errors(settings, make_key):
    admin = await make_key(admin=True)
    async with serve(settings.model_copy(update={"redis_url": CLOSED_REDIS_URL})) as client:
        families = parse((await client.get("/metrics", headers=auth(admin))).text)
    assert value(families, "opd_redis_up") == 0
    assert "opd_queue_length" not in families
    assert value(families, "opd_queue_errors_total", operation="length") >= 1


async def test_the_separate_listen_address_serves_metrics_without_a_key(settings):
    address = f"127.0.0.1:{free_port()}"
    async with (
        serve(settings.model_copy(update={"metrics_listen": address})),
        httpx.AsyncClient() as plain,
    ):
        response = await plain.get(f"http://{address}/metrics")
        other = await plain.get(f"http://{address}/v1/jobs")
    assert response.status_code == 200
    assert "opd_jobs" in parse(response.text)
    assert other.status_code == 404, "only /metrics is served there"
