"""The app as a whole: authentication, body limits, error format, OpenAPI, start-up."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from app.auth.keys import revoke_key
from app.core.config import Settings
from tests.app.conftest import auth, serve, small_spec


async def test_a_missing_key_is_401_with_a_hint(client):
    response = await client.get("/v1/jobs")
    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"] == "Bearer"
    error = response.json()["error"]
    assert error["code"] == "unauthorized"
    assert "X-API-Key" in error["message"]


async def test_an_unknown_key_is_401(client):
    for headers in ({"Authorization": "Bearer opd_nope_nope"}, {"X-API-Key": "opd_nope_nope"}):
        response = await client.get("/v1/jobs", headers=headers)
        assert response.status_code == 401
        assert response.json()["error"]["message"] == "unknown or revoked API key"


async def test_a_revoked_key_is_401(client, key, session):
    assert (await client.get("/v1/jobs", headers=auth(key))).status_code == 200
    assert await revoke_key(session, key.api_key.prefix)
    assert (await client.get("/v1/jobs", headers=auth(key))).status_code == 401


async def test_a_body_over_the_limit_is_413(settings, key):
    limited = settings.model_copy(update={"max_body_bytes": 2048})
    body = small_spec(dataset={"source": "inline", "prompts": ["x" * 4000]})
    async with serve(limited) as client:
        declared = await client.post("/v1/jobs", json=body, headers=auth(key))

        async def chunks():
            for _ in range(4):
                yield b"x" * 1000

        streamed = await client.post("/v1/jobs", content=chunks(), headers=auth(key))
        small = await client.post("/v1/jobs", json=small_spec(), headers=auth(key))
    for response in (declared, streamed):
        assert response.status_code == 413
        assert response.json()["error"]["code"] == "body_too_large"
    assert small.status_code == 201


@pytest.mark.parametrize("media", ["text/yaml", "application/yaml", "application/x-yaml"])
async def test_a_yaml_body_is_a_415_that_says_to_send_json(client, key, media):
    """Before: a 422, `Input should be a valid dictionary or object to extract fields from`."""
    for path in ("/v1/jobs", "/v1/sweeps"):
        response = await client.post(
            path, content=yaml.safe_dump(small_spec()), headers=auth(key) | {"Content-Type": media}
        )
        assert response.status_code == 415, response.text
        assert response.json()["error"] == {
            "code": "unsupported_media_type",
            "message": "the API reads JSON bodies: send Content-Type: application/json (this "
            f"had {media}); a YAML spec or sweep is read by `opd submit FILE`, `opd sweep "
            "create FILE` and the SDK's load_spec, which send it as JSON",
            "param": None,
        }
    assert (await client.get("/v1/jobs", headers=auth(key))).json()["data"] == []


async def test_a_body_without_a_content_type_is_a_415_and_json_is_read(client, key):
    untyped = await client.post("/v1/jobs", content=json.dumps(small_spec()), headers=auth(key))
    assert untyped.status_code == 415
    assert "(this had no Content-Type)" in untyped.json()["error"]["message"]
    typed = await client.post(
        "/v1/jobs",
        content=json.dumps(small_spec()),
        headers=auth(key) | {"Content-Type": "application/json; charset=utf-8"},
    )
    assert typed.status_code == 201, typed.text
    empty = await client.post(f"/v1/jobs/{typed.json()['id']}/cancel", headers=auth(key))
    assert empty.status_code == 200, "an action without a body needs no content type"


async def test_unknown_routes_use_the_error_format(client):
    response = await client.get("/v2/nothing")
    assert response.status_code == 404
    assert response.json()["error"] == {"code": "not_found", "message": "Not Found", "param": None}
    response = await client.delete("/healthz")
    assert response.status_code == 405
    assert response.json()["error"]["code"] == "method_not_allowed"


async def test_openapi_documents_models_and_errors(client):
    spec = (await client.get("/openapi.json")).json()
    paths = spec["paths"]
    assert set(paths) >= {
        "/v1/jobs",
        "/v1/jobs/{job_id}",
        "/v1/jobs/{job_id}/cancel",
        "/v1/jobs/{job_id}/pause",
        "/v1/jobs/{job_id}/resume",
        "/v1/jobs/{job_id}/metrics",
        "/v1/jobs/{job_id}/metrics/stream",
        "/v1/jobs/{job_id}/checkpoints",
        "/v1/jobs/{job_id}/events",
        "/healthz",
        "/readyz",
    }
    submit = paths["/v1/jobs"]["post"]
    assert submit["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/JobSpec"
    )
    error_ref = "#/components/schemas/ErrorResponse"
    for status in ("401", "413", "422"):
        assert submit["responses"][status]["content"]["application/json"]["schema"]["$ref"] == (
            error_ref
        )
    read = paths["/v1/jobs/{job_id}"]["get"]["responses"]
    assert read["200"]["content"]["application/json"]["schema"]["$ref"].endswith("/JobPublic")
    assert read["404"]["content"]["application/json"]["schema"]["$ref"] == error_ref
    cancel = paths["/v1/jobs/{job_id}/cancel"]["post"]["responses"]
    assert cancel["409"]["content"]["application/json"]["schema"]["$ref"] == error_ref
    assert set(spec["components"]["securitySchemes"]) == {"HTTPBearer", "APIKeyHeader"}
    assert (await client.get("/docs")).status_code == 200


async def test_start_up_migrates_a_new_sqlite_database(tmp_path):
    settings = Settings(home=tmp_path, redis_url=None, migrate_on_start=True)
    async with serve(settings) as client:
        response = await client.get("/readyz")
    assert "database" not in response.json()["error"]["message"], "tables exist and answer"
    assert (tmp_path / "opd.db").exists()


def test_importing_the_api_loads_neither_torch_nor_the_worker():
    code = (
        "import sys, app.main; "
        "bad = [m for m in sys.modules if m == 'torch' or m.split('.')[0] == 'worker']; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
