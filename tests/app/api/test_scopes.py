"""Every route with every scope, enumerated from the OpenAPI document (so a new route is
checked the day it appears): a key beyond its scope gets a 403 naming the scope needed, a
key within it gets through (and every change it makes is in the audit log), an expired
key gets a 401 saying so. The document itself states each route's scope."""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select

from app.audit.tables import AuditEntry
from app.auth.keys import NewKey, create_key
from app.auth.schemas import Scope
from app.core.encryption import SecretBox
from app.core.tables import utcnow
from app.jobs.schemas import JobAction
from app.jobs.store import apply_action, create_job
from app.webhooks.store import create_webhook
from app.webhooks.tables import WebhookDelivery
from kernel.spec import JobSpec
from tests.app.conftest import auth, small_spec

PUBLIC = {("GET", "/healthz"), ("GET", "/readyz")}
NOT_IN_THE_DOCUMENT = {("GET", "/metrics")}  # Prometheus text, not JSON
BEYOND_THE_METHOD = {
    ("GET", "/v1/teams"): Scope.admin,
    ("PATCH", "/v1/teams/{name}"): Scope.admin,
    ("GET", "/v1/keys"): Scope.admin,
    ("POST", "/v1/keys"): Scope.admin,
    ("DELETE", "/v1/keys/{prefix}"): Scope.admin,
    ("GET", "/metrics"): Scope.admin,
    ("GET", "/v1/teams/{team}/budget"): Scope.admin,
    ("PUT", "/v1/teams/{team}/budget"): Scope.admin,
    ("DELETE", "/v1/teams/{team}/budget"): Scope.admin,
}
EVENTS = ["job.succeeded", "job.failed", "job.cancelled", "job.paused", "job.eval_completed"]


def needed(method: str, path: str) -> Scope:
    """The rule this test holds the service to: reads need `read`, changes `submit`, and the
    routes listed above more."""
    default = Scope.read if method == "GET" else Scope.submit
    return BEYOND_THE_METHOD.get((method, path), default)


@dataclass
class World:
    """One team's keys of each scope, and what its routes act on (made fresh per request,
    so every allowed change succeeds)."""

    sessions: Any
    box: SecretBox
    team: str
    keys: dict[Scope, NewKey] = field(default_factory=dict)

    async def job(self, status: str = "queued") -> int:
        team_id = self.keys[Scope.read].team.id
        async with self.sessions() as session:
            created = await create_job(session, team_id, JobSpec.model_validate(small_spec()))
            if status == "paused":
                await apply_action(session, created.job.id, JobAction.pause)
            if status == "cancelled":
                await apply_action(session, created.job.id, JobAction.cancel)
        return created.job.id

    async def webhook(self) -> int:
        async with self.sessions() as session:
            team_id = self.keys[Scope.read].team.id
            url = "https://hooks.example.com/x"
            hook = await create_webhook(session, self.box, team_id, url, EVENTS, None)
        return hook.id

    async def delivery(self, webhook_id: int) -> int:
        job_id = await self.job("cancelled")  # the cancel wrote a delivery to every webhook
        async with self.sessions() as session:
            return (
                await session.execute(
                    select(WebhookDelivery.id).where(
                        WebhookDelivery.job_id == job_id, WebhookDelivery.webhook_id == webhook_id
                    )
                )
            ).scalar_one()

    async def spare_key(self) -> str:
        async with self.sessions() as session:
            return (await create_key(session, self.team)).api_key.prefix

    async def request(self, method: str, path: str) -> tuple[str, dict[str, Any]]:
        """The concrete URL and request options for one operation."""
        values: dict[str, Any] = {"name": self.team}
        if "{job_id}" in path:
            action = path.rsplit("/", 1)[-1]
            status = {"resume": "paused", "cancel": "queued", "pause": "queued"}.get(action)
            values["job_id"] = await self.job(status or "cancelled")
        if "{webhook_id}" in path:
            values["webhook_id"] = await self.webhook()
        if "{delivery_id}" in path:
            values["delivery_id"] = await self.delivery(values["webhook_id"])
        if "{prefix}" in path:
            values["prefix"] = await self.spare_key()
        url = re.sub(r"\{(\w+)\}", lambda m: str(values.get(m.group(1), 1)), path)
        options: dict[str, Any] = {}
        if (method, path) in self.bodies:
            options["json"] = self.bodies[(method, path)]
        if path == "/v1/metrics":
            options["params"] = {"jobs": await self.job("cancelled")}
        return url, options

    @property
    def bodies(self) -> dict[tuple[str, str], Any]:
        return {
            ("POST", "/v1/jobs"): small_spec(),
            ("POST", "/v1/webhooks"): {"url": "https://hooks.example.com/x", "events": EVENTS},
            ("POST", "/v1/keys"): {"team": self.team, "scope": "read"},
            ("PATCH", "/v1/teams/{name}"): {"max_running": 5},
        }

    def can_build(self, method: str, path: str, operation: dict[str, Any]) -> bool:
        """Whether this test knows a valid request for the operation (a route it does not
        know yet is still held to its scope, not to succeeding)."""
        required = [p["name"] for p in operation.get("parameters", []) if p.get("required")]
        known = {"job_id", "webhook_id", "delivery_id", "prefix", "name", "jobs"}
        body = operation.get("requestBody", {}).get("required")
        return set(required) <= known and (not body or (method, path) in self.bodies)


def operations(document: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (method.upper(), path, operation)
        for path, item in document["paths"].items()
        for method, operation in item.items()
    ]


async def audit_count(sessions, prefix: str) -> int:
    async with sessions() as session:
        query = select(func.count()).where(AuditEntry.key_prefix == prefix)
        return (await session.execute(query)).scalar_one()


async def test_every_route_answers_each_scope_as_the_rule_says(client, sessions, make_key, box):
    team = f"scopes-{uuid.uuid4().hex[:8]}"
    world = World(sessions, box, team)
    for scope in Scope:
        world.keys[scope] = await make_key(team, scope=scope)
    document = (await client.get("/openapi.json")).json()
    listed = operations(document)
    assert len(listed) >= 29, "every route is in the document"

    for method, path, operation in listed:
        if (method, path) in PUBLIC:
            assert "x-opd-scope" not in operation, path
            continue
        assert operation.get("x-opd-scope") == needed(method, path).value, (method, path)
    checked = [(m, p, world.can_build(m, p, op)) for m, p, op in listed if (m, p) not in PUBLIC]
    checked += [(method, path, True) for method, path in sorted(NOT_IN_THE_DOCUMENT)]
    assert sum(buildable for *_, buildable in checked) >= 28

    for method, path, buildable in checked:
        scope_needed = needed(method, path)
        for scope, key in world.keys.items():
            url, options = await world.request(method, path)
            audited = await audit_count(sessions, key.api_key.prefix)
            response = await send(client, method, url, key, options)
            what = (
                f"{method} {url} with a {scope.value} key: {response.status_code} {response.text}"
            )
            if scope.allows(scope_needed):
                assert response.status_code not in (401, 403), what
                assert response.status_code < 400 or not buildable, what
                if method != "GET" and response.status_code < 400:
                    assert await audit_count(sessions, key.api_key.prefix) == audited + 1, what
            else:
                assert response.status_code == 403, what
                message = response.json()["error"]["message"]
                assert f"needs a key with the {scope_needed.value!r} scope" in message, what
                assert f"this key's scope is {scope.value!r}" in message, what
                if method != "GET":
                    assert await audit_count(sessions, key.api_key.prefix) == audited + 1, what


async def send(
    client: httpx.AsyncClient, method: str, url: str, key: NewKey, options: dict[str, Any]
) -> httpx.Response:
    return await client.request(method, url, headers=auth(key), **options)


async def test_an_expired_key_is_refused_with_a_401_that_says_so(client, sessions):
    async with sessions() as session:
        expired = await create_key(
            session, f"expired-{uuid.uuid4().hex[:8]}", expires_at=utcnow() - timedelta(hours=1)
        )

    for method, url in (("GET", "/v1/jobs"), ("POST", "/v1/jobs"), ("GET", "/v1/usage")):
        response = await client.request(method, url, headers=auth(expired), json=small_spec())
        assert response.status_code == 401
        assert "the API key expired at" in response.json()["error"]["message"]


@pytest.mark.parametrize("days", [True, "90", 1.5, 0])
async def test_an_expiry_that_is_not_a_whole_number_of_days_is_a_422(client, make_key, days):
    """As the document says (an integer, which 90.0 is too): `true` is not 1 day, nor "90"
    90 (the fuzzer found `true` accepted)."""
    admin = await make_key(admin=True)
    created = await client.post(
        "/v1/keys",
        json={"team": f"t-{uuid.uuid4().hex[:6]}", "expires_in_days": days},
        headers=auth(admin),
    )
    assert created.status_code == 422, created.text
    assert created.json()["error"]["param"] == "expires_in_days"


async def test_a_key_created_with_an_expiry_works_until_then(client, make_key):
    admin = await make_key(admin=True)
    created = await client.post(
        "/v1/keys",
        json={"team": f"t-{uuid.uuid4().hex[:6]}", "scope": "read", "expires_in_days": 90},
        headers=auth(admin),
    )
    assert created.status_code == 201, created.text
    body = created.json()
    assert body["expires_at"].startswith(str((utcnow() + timedelta(days=90)).date()))
    assert body["scope"] == "read" and body["prefix"] in body["key"]
    read_key = {"Authorization": f"Bearer {body['key']}"}
    assert (await client.get("/v1/jobs", headers=read_key)).status_code == 200
    refused = await client.post("/v1/jobs", json=small_spec(), headers=read_key)
    assert refused.status_code == 403
