"""A job's timeline over HTTP."""

from __future__ import annotations

from app.records.store import record_event
from tests.app.conftest import auth


async def test_events_record_every_transition_in_order(client, key, submit, session):
    job = await submit()
    await client.post(f"/v1/jobs/{job['id']}/pause", headers=auth(key))
    await client.post(f"/v1/jobs/{job['id']}/resume", headers=auth(key))
    await record_event(session, job["id"], "warning", "Slow teacher", {"seconds": 12.5})
    url = f"/v1/jobs/{job['id']}/events"

    events = (await client.get(url, headers=auth(key))).json()["data"]
    assert [e["message"] for e in events] == [
        "Job created",
        "Paused while queued",
        "Resumed; waiting for a worker",
        "Slow teacher",
    ]
    assert events[1]["data"] == {"from": "queued", "to": "paused"}
    assert events[3]["level"] == "warning"
    assert events[3]["data"] == {"seconds": 12.5}
    assert all(e["created_at"].endswith("Z") or "+00:00" in e["created_at"] for e in events)

    page = (await client.get(url, params={"limit": 3}, headers=auth(key))).json()
    assert len(page["data"]) == 3
    tail = await client.get(url, params={"after": page["next_cursor"]}, headers=auth(key))
    assert [e["message"] for e in tail.json()["data"]] == ["Slow teacher"]
