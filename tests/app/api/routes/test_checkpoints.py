"""Listing a job's saved weights."""

from __future__ import annotations

from app.jobs.store import claim_job
from app.records.store import record_checkpoint
from tests.app.conftest import auth


async def test_checkpoints_oldest_first_with_kind_filter_and_pages(
    client, make_key, submit, session
):
    job = await submit(loop={"steps": 4})
    key = await make_key(admin=True)  # the paths as recorded (a team sees their names)
    await claim_job(session, job["id"], "w", heartbeat_timeout=60)
    saved = [(2, "state", "/s/2"), (2, "sampler", "/w/2"), (4, "final", "/w/final")]
    for step, kind, path in saved:
        await record_checkpoint(session, job["id"], "w", step, kind, path)
    url = f"/v1/jobs/{job['id']}/checkpoints"

    everything = (await client.get(url, headers=auth(key))).json()
    assert [(c["step"], c["kind"], c["path"]) for c in everything["data"]] == saved
    assert everything["next_cursor"] is None

    first = (await client.get(url, params={"limit": 2}, headers=auth(key))).json()
    rest = await client.get(url, params={"after": first["next_cursor"]}, headers=auth(key))
    assert [c["path"] for c in first["data"] + rest.json()["data"]] == ["/s/2", "/w/2", "/w/final"]

    final = (await client.get(url, params={"kind": "final"}, headers=auth(key))).json()
    assert [c["path"] for c in final["data"]] == ["/w/final"]
    job_now = (await client.get(f"/v1/jobs/{job['id']}", headers=auth(key))).json()
    assert job_now["final_weights_path"] == "/w/final"
    assert (job_now["last_state_path"], job_now["last_state_step"]) == ("/s/2", 2)
