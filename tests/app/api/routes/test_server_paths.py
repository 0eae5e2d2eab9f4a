"""A team's keys never see a worker's folder (issue 36): its job, events, checkpoints, webhook
payloads and dashboard page name saved weights from the job's folder on, or by their
`opd-store://` name or remote URI; an admin key still sees the folders as recorded."""

from __future__ import annotations

from sqlalchemy import select

from app.jobs.store import claim_job, complete_job
from app.records.store import record_checkpoint, record_event
from app.webhooks.store import create_webhook
from app.webhooks.tables import WebhookDelivery
from tests.app.conftest import auth, serve

STORED = "opd-store://" + "a" * 64 + "/sampler/step-2"
REMOTE = "tinker://run-7/sampler_weights/step-1"


async def saved_job(session, submit, settings, box) -> tuple[dict, str]:
    """A succeeded job whose worker saved its weights under the artifact root, with events
    as the old worker wrote them (folders in their text) and a webhook to tell."""
    job = await submit(loop={"steps": 4})
    folder = f"{settings.artifact_root}/job-{job['id']}"
    await create_webhook(
        session, box, job["team_id"], "https://a.example/h", ["job.succeeded"], None
    )
    await claim_job(session, job["id"], "w", heartbeat_timeout=60)
    saved = [(2, "state", f"{folder}/state-2"), (2, "sampler", STORED), (3, "sampler", REMOTE)]
    for step, kind, path in [*saved, (4, "final", f"{folder}/final")]:
        await record_checkpoint(session, job["id"], "w", step, kind, path)
    await record_event(
        session, job["id"], "info", f"Saved weights: {folder}/final", {"path": f"{folder}/final"}
    )
    await record_event(
        session,
        job["id"],
        "info",
        "See POST /v1/jobs/1/clone",
        {"nested": [f"{settings.home}/cache/x"]},
    )
    await complete_job(session, job["id"], "w", f"{folder}/final")
    return job, folder


def continuing(job: dict) -> dict:
    """A teacher of the job's final weights (the service fills in their path)."""
    return {"base_model": job["spec"]["student"]["base_model"], "init_from": {"job": job["id"]}}


async def test_a_team_sees_names_where_an_admin_sees_the_workers_folders(
    client, key, make_key, submit, session, settings, box
):
    job, folder = await saved_job(session, submit, settings, box)
    admin = await make_key(admin=True)
    root = str(settings.artifact_root)
    continued = await submit(teacher=continuing(job))
    reads = [
        f"/v1/jobs/{job['id']}",
        "/v1/jobs",
        f"/v1/jobs/{job['id']}/events",
        f"/v1/jobs/{job['id']}/checkpoints",
        f"/v1/jobs/{continued['id']}",
    ]

    team = {url: await client.get(url, headers=auth(key)) for url in reads}
    admins = {url: await client.get(url, headers=auth(admin)) for url in reads}

    for url, answer in team.items():
        assert answer.status_code == 200 and root not in answer.text, url
    for url in (reads[0], reads[2], reads[3], reads[4]):
        assert folder in admins[url].text, url
    shown = team[reads[0]].json()
    assert shown["final_weights_path"] == f"job-{job['id']}/final"
    assert shown["last_state_path"] == f"job-{job['id']}/state-2"
    paths = [c["path"] for c in team[reads[3]].json()["data"]]
    assert paths == [f"job-{job['id']}/state-2", STORED, REMOTE, f"job-{job['id']}/final"]
    events = team[reads[2]].json()["data"]
    messages = [event["message"] for event in events]
    assert f"Saved weights: job-{job['id']}/final" in messages
    assert "See POST /v1/jobs/1/clone" in messages  # a route is not a folder
    assert {"nested": ["[server folder]"]} in [event["data"] for event in events]
    teacher = team[reads[4]].json()["spec"]["teacher"]["init_from"]
    assert teacher["path"] == f"job-{job['id']}/final"
    assert admins[reads[4]].json()["spec"]["teacher"]["init_from"]["path"] == f"{folder}/final"


async def test_the_cached_job_body_is_one_per_audience(
    key, make_key, submit, session, settings, box
):
    job, folder = await saved_job(session, submit, settings, box)
    admin = await make_key(admin=True)
    async with serve(settings.model_copy(update={"job_cache_seconds": 60})) as cached:
        first = await cached.get(f"/v1/jobs/{job['id']}", headers=auth(admin))
        then = await cached.get(f"/v1/jobs/{job['id']}", headers=auth(key))
        again = await cached.get(f"/v1/jobs/{job['id']}", headers=auth(admin))

    assert (
        first.json()["final_weights_path"]
        == f"{folder}/final"
        == again.json()["final_weights_path"]
    )
    assert then.json()["final_weights_path"] == f"job-{job['id']}/final"


async def test_a_webhook_payload_names_the_weights(submit, session, settings, box):
    job, _ = await saved_job(session, submit, settings, box)

    rows = await session.execute(select(WebhookDelivery).where(WebhookDelivery.job_id == job["id"]))
    (delivery,) = rows.scalars()

    assert str(settings.artifact_root) not in str(delivery.payload)
    assert delivery.payload["data"]["final_weights_path"] == f"job-{job['id']}/final"
