"""Liveness and readiness probes."""

from __future__ import annotations

from tests.app.conftest import CLOSED_REDIS_URL, serve


async def test_healthz_answers_without_a_key(client):
    response = await client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


async def test_readyz_checks_the_database_and_redis(client):
    response = await client.get("/readyz")
    assert response.status_code == 200
    assert response.json() == {"status": "ready"}


async def test_readyz_is_503_when_redis_is_unreachable(settings):
    async with serve(settings.model_copy(update={"redis_url": CLOSED_REDIS_URL})) as client:
        response = await client.get("/readyz")
    assert response.status_code == 503
    error = response.json()["error"]
    assert error["code"] == "not_ready"
    assert "127.0.0.1:1" in error["message"]


async def test_readyz_is_503_without_a_configured_redis(settings):
    async with serve(settings.model_copy(update={"redis_url": None})) as client:
        response = await client.get("/readyz")
    assert response.status_code == 503
    assert "OPD_REDIS_URL" in response.json()["error"]["message"]


async def test_a_database_that_is_down_is_503_not_500(settings):
    down = settings.model_copy(update={"database_url": "postgresql://postgres@127.0.0.1:1/none"})
    async with serve(down) as client:
        ready = await client.get("/readyz")
        jobs = await client.get("/v1/jobs", headers={"X-API-Key": "opd_any_key"})
    assert ready.status_code == 503
    assert ready.json()["error"]["message"].startswith("database: ")
    assert jobs.status_code == 503
    assert jobs.json()["error"]["code"] == "database_unavailable"
