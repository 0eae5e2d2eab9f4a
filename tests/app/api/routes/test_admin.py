"""What admin keys manage over HTTP (teams' limits, keys) and the audit log of every change;
a team over its queued limit gets a 429 with Retry-After."""

from __future__ import annotations

import uuid

from app.auth.schemas import Scope
from app.core.config import Settings
from tests.app.conftest import auth, serve, small_spec


async def test_team_limits_are_set_and_listed_by_admins(client, key, make_key):
    admin = await make_key(admin=True)
    name = key.team.name

    changed = await client.patch(
        f"/v1/teams/{name}", json={"max_running": 2, "max_queued": 5}, headers=auth(admin)
    )
    back = await client.patch(f"/v1/teams/{name}", json={"max_queued": None}, headers=auth(admin))
    listed = (await client.get("/v1/teams", headers=auth(admin))).json()["data"]

    assert changed.status_code == 200, changed.text
    assert (changed.json()["max_running"], changed.json()["max_queued"]) == (2, 5)
    assert (back.json()["max_running"], back.json()["max_queued"]) == (2, None)
    (mine,) = [team for team in listed if team["name"] == name]
    assert mine["effective_max_running"] == 2 and mine["effective_max_queued"] is None
    missing = await client.patch("/v1/teams/nobody", json={"max_running": 1}, headers=auth(admin))
    assert missing.status_code == 404
    zero = await client.patch(f"/v1/teams/{name}", json={"max_running": 0}, headers=auth(admin))
    assert zero.status_code == 422 and zero.json()["error"]["param"] == "max_running"


async def test_over_the_queued_limit_a_post_is_a_429_with_retry_after(settings: Settings, key):
    async with serve(settings.model_copy(update={"team_max_queued": 1})) as client:
        first = await client.post("/v1/jobs", json=small_spec(), headers=auth(key))
        second = await client.post("/v1/jobs", json=small_spec(), headers=auth(key))
    assert first.status_code == 201
    assert second.status_code == 429
    assert second.headers["retry-after"] == "60"
    assert "max_queued 1" in second.json()["error"]["message"]


async def test_keys_are_created_listed_and_revoked_by_admins(client, make_key):
    admin = await make_key(admin=True)
    team = f"k-{uuid.uuid4().hex[:6]}"
    created = (
        await client.post("/v1/keys", json={"team": team, "scope": "submit"}, headers=auth(admin))
    ).json()
    new_key = {"Authorization": f"Bearer {created['key']}"}
    assert (await client.get("/v1/jobs", headers=new_key)).status_code == 200

    listed = (await client.get("/v1/keys", headers=auth(admin))).json()["data"]
    (entry,) = [k for k in listed if k["prefix"] == created["prefix"]]
    assert (entry["team"], entry["scope"], entry["revoked_at"]) == (team, "submit", None)
    assert "key" not in entry
    revoked = await client.delete(f"/v1/keys/{created['prefix']}", headers=auth(admin))
    assert revoked.status_code == 204
    assert (await client.get("/v1/jobs", headers=new_key)).status_code == 401
    again = await client.delete(f"/v1/keys/{created['prefix']}", headers=auth(admin))
    assert again.status_code == 404


async def test_the_audit_log_names_who_did_what_to_which_target(client, key, make_key, submit):
    job = await submit()
    await client.post(f"/v1/jobs/{job['id']}/pause", headers=auth(key))
    await client.post(f"/v1/jobs/{job['id']}/resume", headers=auth(key))
    reader = await make_key(key.team.name)
    admin = await make_key(admin=True)

    entries = (await client.get("/v1/audit", headers=auth(key))).json()["data"]
    mine = [(e["action"], e["target"], e["key_prefix"]) for e in entries]
    assert mine[:3] == [
        ("job.resume", f"job {job['id']}", key.api_key.prefix),
        ("job.pause", f"job {job['id']}", key.api_key.prefix),
        ("job.create", f"job {job['id']}", key.api_key.prefix),
    ]
    assert {e["team_id"] for e in entries} == {key.team.id}, "a team sees its own entries"
    assert {e["team"] for e in entries} == {key.team.name}, "named as usage names it"
    other = (await client.get("/v1/audit", headers=auth(reader))).json()["data"]
    assert [e["id"] for e in other] == [e["id"] for e in entries]
    every = (await client.get("/v1/audit?action=job.pause", headers=auth(admin))).json()["data"]
    assert every and {e["action"] for e in every} == {"job.pause"}
    old_name = await client.get("/v1/audit?action=job.submit", headers=auth(key))
    assert [e["action"] for e in old_name.json()["data"]] == ["job.create"]


async def test_a_read_key_reads_the_audit_log(client, key, make_key, submit):
    await submit()
    reader = await make_key(key.team.name, scope=Scope.read)
    entries = await client.get("/v1/audit", headers=auth(reader))
    assert entries.status_code == 200
    assert [e["action"] for e in entries.json()["data"]] == ["job.create"]


async def test_an_unknown_action_filter_says_so_and_lists_the_actions(client, key):
    response = await client.get("/v1/audit?action=nonsense", headers=auth(key))
    assert response.status_code == 422
    error = response.json()["error"]
    assert error["param"] == "action"
    assert error["message"].startswith("no audit action 'nonsense'; the actions are job.create,")
    assert "job.cancel" in error["message"] and "webhook.create" in error["message"]
    refused = await client.get("/v1/audit?action=POST%20/v1/jobs", headers=auth(key))
    assert refused.status_code == 200
