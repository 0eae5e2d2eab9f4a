"""The dashboard honours a key's scope: a `read` key's session sees no actions and may not
act or submit; a `submit` key's actions are audited; an expired key cannot sign in."""

from __future__ import annotations

import html
from datetime import timedelta

from sqlalchemy import select

from app.audit.tables import AuditEntry
from app.auth.keys import create_key
from app.auth.schemas import Scope
from app.core.tables import utcnow
from tests.app.conftest import auth
from tests.app.web.conftest import post_form


async def test_a_read_key_sees_no_actions_and_cannot_act_or_submit(
    client, key, make_key, sign_in, submit
):
    job = await submit()
    reader = await make_key(key.team.name, scope=Scope.read)
    await sign_in(reader)

    page = await client.get(f"/ui/jobs/{job['id']}")
    assert page.status_code == 200
    assert f'action="/ui/jobs/{job["id"]}/pause"' not in page.text
    refused = await post_form(client, f"/ui/jobs/{job['id']}/pause", page)
    form = await client.get("/ui/new")
    submitted = await post_form(client, "/ui/new", form, spec="name: x\n", idempotency_key="k")

    assert refused.status_code == 403 and "'submit' scope" in html.unescape(refused.text)
    assert submitted.status_code == 403
    read = await client.get(f"/v1/jobs/{job['id']}", headers=auth(key))
    assert read.json()["status"] == "queued"


async def test_a_submit_keys_page_actions_are_audited(client, key, sign_in, submit, session):
    job = await submit()
    await sign_in(key)
    page = await client.get(f"/ui/jobs/{job['id']}")
    assert f'action="/ui/jobs/{job["id"]}/pause"' in page.text

    assert (await post_form(client, f"/ui/jobs/{job['id']}/pause", page)).status_code == 303

    entry = (
        (
            await session.execute(
                select(AuditEntry)
                .where(
                    AuditEntry.key_prefix == key.api_key.prefix, AuditEntry.action == "job.pause"
                )
                .order_by(AuditEntry.id.desc())
            )
        )
        .scalars()
        .first()
    )
    assert (entry.target, entry.detail["via"]) == (f"job {job['id']}", "dashboard")


async def test_an_expired_key_cannot_sign_in(client, session):
    expired = await create_key(session, "web-expired", expires_at=utcnow() - timedelta(days=1))
    page = await client.get("/ui/sign-in")
    response = await post_form(client, "/ui/sign-in", page, key=expired.key, next="/ui/jobs")
    assert response.status_code == 401
    assert "expired" in response.text
