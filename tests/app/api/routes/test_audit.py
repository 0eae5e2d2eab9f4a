"""An action and its audit row commit together: when the database refuses the row, the
action is undone too, and when it refuses the action, no row claims it happened."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from sqlalchemy import func, select, text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.audit.tables import AuditEntry
from tests.app.conftest import auth, serve, small_spec
from tests.app.web.conftest import NAMED_YAML, post_form

HOOK = {"url": "https://hooks.example.com/opd", "events": ["job.succeeded"]}


@asynccontextmanager
async def refused(
    sessions: async_sessionmaker[AsyncSession], table: str, operation: str
) -> AsyncIterator[None]:
    """Every `operation` (INSERT, UPDATE) on `table` fails in the database itself."""
    name = f"refuse_{uuid.uuid4().hex[:8]}"
    async with sessions() as session:
        if session.bind.dialect.name == "sqlite":
            create = [
                f"CREATE TRIGGER {name} BEFORE {operation} ON {table} "
                "BEGIN SELECT RAISE(ABORT, 'refused by the test'); END"
            ]
            drop = [f"DROP TRIGGER {name}"]
        else:
            create = [
                f"CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS "
                "$$ BEGIN RAISE EXCEPTION 'refused by the test'; END $$",
                f"CREATE TRIGGER {name} BEFORE {operation} ON {table} "
                f"FOR EACH ROW EXECUTE FUNCTION {name}()",
            ]
            drop = [f"DROP TRIGGER {name} ON {table}", f"DROP FUNCTION {name}()"]
        for statement in create:
            await session.execute(text(statement))
        await session.commit()
        try:
            yield
        finally:
            for statement in drop:
                await session.execute(text(statement))
            await session.commit()


async def audit_rows(sessions: async_sessionmaker[AsyncSession], team_id: int, action: str) -> int:
    async with sessions() as session:
        query = select(func.count()).where(
            AuditEntry.team_id == team_id, AuditEntry.action == action
        )
        return (await session.execute(query)).scalar_one()


@pytest.fixture
async def api(settings):
    async with serve(settings, raising=False) as http:
        yield http


async def test_without_its_audit_row_no_job_is_submitted_cancelled_or_resumed(api, key, sessions):
    headers = auth(key)
    job = (await api.post("/v1/jobs", json=small_spec(), headers=headers)).json()
    await api.post(f"/v1/jobs/{job['id']}/pause", headers=headers)
    async with refused(sessions, "audit_log", "INSERT"):
        submitted = await api.post("/v1/jobs", json=small_spec(), headers=headers)
        cancelled = await api.post(f"/v1/jobs/{job['id']}/cancel", headers=headers)
        resumed = await api.post(f"/v1/jobs/{job['id']}/resume", headers=headers)
    assert submitted.status_code == cancelled.status_code == resumed.status_code == 500
    jobs = (await api.get("/v1/jobs", headers=headers)).json()["data"]
    assert [(j["id"], j["status"]) for j in jobs] == [(job["id"], "paused")]


async def test_without_its_audit_row_no_webhook_key_or_limit_changes(api, key, make_key, sessions):
    admin = auth(await make_key(admin=True))
    hook = (await api.post("/v1/webhooks", json=HOOK, headers=auth(key))).json()
    async with refused(sessions, "audit_log", "INSERT"):
        answers = [
            await api.post("/v1/webhooks", json=HOOK, headers=auth(key)),
            await api.delete(f"/v1/webhooks/{hook['id']}", headers=auth(key)),
            await api.post("/v1/keys", json={"team": "never-made"}, headers=admin),
            await api.delete(f"/v1/keys/{key.api_key.prefix}", headers=admin),
            await api.patch(f"/v1/teams/{key.team.name}", json={"max_running": 1}, headers=admin),
        ]
    assert [answer.status_code for answer in answers] == [500] * len(answers)
    hooks = (await api.get("/v1/webhooks", headers=auth(key))).json()["data"]
    assert [h["id"] for h in hooks] == [hook["id"]], "none made, none deleted"
    keys = (await api.get("/v1/keys", headers=admin)).json()["data"]
    assert "never-made" not in {k["team"] for k in keys}
    (mine,) = [k for k in keys if k["prefix"] == key.api_key.prefix]
    assert mine["revoked_at"] is None, "the key still works"
    teams = (await api.get("/v1/teams", headers=admin)).json()["data"]
    (team,) = [t for t in teams if t["name"] == key.team.name]
    assert team["max_running"] is None


async def test_without_its_audit_row_the_dashboard_neither_cancels_nor_submits(api, key, sessions):
    job = (await api.post("/v1/jobs", json=small_spec(), headers=auth(key))).json()
    await post_form(api, "/ui/sign-in", await api.get("/ui/sign-in"), key=key.key)
    job_page, new_page = await api.get(f"/ui/jobs/{job['id']}"), await api.get("/ui/new")
    spec = "name: web\ndataset: {source: inline, prompts: [hi]}\n" + NAMED_YAML
    async with refused(sessions, "audit_log", "INSERT"):
        cancelled = await post_form(api, f"/ui/jobs/{job['id']}/cancel", job_page)
        submitted = await post_form(api, "/ui/new", new_page, spec=spec, idempotency_key="k")
    assert cancelled.status_code == submitted.status_code == 500
    jobs = (await api.get("/v1/jobs", headers=auth(key))).json()["data"]
    assert [(j["id"], j["status"]) for j in jobs] == [(job["id"], "queued")]


async def test_an_action_the_database_refuses_leaves_no_audit_row(api, key, sessions):
    headers = auth(key)
    job = (await api.post("/v1/jobs", json=small_spec(), headers=headers)).json()
    async with refused(sessions, "jobs", "UPDATE"):
        cancelled = await api.post(f"/v1/jobs/{job['id']}/cancel", headers=headers)
    async with refused(sessions, "webhooks", "INSERT"):
        created = await api.post("/v1/webhooks", json=HOOK, headers=headers)
    assert cancelled.status_code == created.status_code == 500
    assert (await api.get(f"/v1/jobs/{job['id']}", headers=headers)).json()["status"] == "queued"
    assert await audit_rows(sessions, key.team.id, "job.cancel") == 0
    assert await audit_rows(sessions, key.team.id, "webhook.create") == 0
