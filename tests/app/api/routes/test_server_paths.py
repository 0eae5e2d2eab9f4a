"""A team's keys never see a worker's folder (issue 36): its job, events, checkpoints, webhook
payloads and dashboard page name saved weights from the job's folder on, or by their
`opd-store://` name or remote URI; an admin key still sees the folders as recorded. Every
team-visible door of a deployment whose home has a recognisable name shows no trace of it
(issue 47), whatever folder under it a worker wrote (artifacts, data, cache)."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from app.jobs.continuation import fill_init_from
from app.jobs.store import claim_job, complete_job, create_job, fail_job
from app.records.store import record_checkpoint, record_event, record_step
from app.sweeps.schemas import SweepCreate
from app.sweeps.store import create_sweep
from app.webhooks.store import create_webhook
from app.webhooks.tables import WebhookDelivery
from kernel.spec import JobSpec
from tests.app.conftest import auth, serve, small_spec
from tests.app.web.conftest import post_form

MARK = "opd-home-QUOKKA"
"""The recognisable name of the deployment's home: no team-visible answer may carry it."""


@pytest.fixture
def tmp_path(tmp_path):
    """The deployment's home (the settings' data, artifacts and cache under it), named MARK."""
    home = tmp_path / MARK
    home.mkdir()
    return home


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


async def trial_of(session, key, job: dict, folder: str) -> int:
    """A sweep whose best (succeeded) trial is taught by `job`'s final weights, its
    `init_from.path` filled with their folder; the sweep's id."""
    definition = SweepCreate.model_validate(
        {
            "name": "around",
            "base": small_spec(),
            "parameters": {"optim.learning_rate": {"values": [1e-3]}},
            "method": "grid",
            "metric": {"name": "opd/reverse_kl_mean", "goal": "minimize"},
        }
    )
    sweep, _ = await create_sweep(session, key.team.id, definition)
    teacher = {**continuing(job), "init_from": {"job": job["id"]}}
    spec = await fill_init_from(
        session, key.team.id, JobSpec.model_validate(small_spec(teacher=teacher))
    )
    assert spec.teacher.init_from is not None and spec.teacher.init_from.path == f"{folder}/final"
    trial = (await create_job(session, key.team.id, spec, trial=(sweep.id, 1))).job
    await claim_job(session, trial.id, "w", heartbeat_timeout=60)
    await record_step(session, trial.id, "w", 0, {"opd/reverse_kl_mean": 0.5})
    await complete_job(session, trial.id, "w", f"{settings_folder(folder, trial.id)}/final")
    return sweep.id


def settings_folder(folder: str, job_id: int) -> str:
    return folder.rsplit("/", 1)[0] + f"/job-{job_id}"


async def test_no_team_visible_door_names_the_deployments_home(
    client, key, submit, session, settings, box
):
    """A worker wrote folders of every kind under the home (the artifact root, the data
    root a relative model_path resolved under, the model cache a GGUF was converted into):
    every answer, event, error, webhook payload and page the team reads is free of them."""
    home = str(settings.home)
    assert MARK in home and str(settings.data_root).startswith(home)
    job, folder = await saved_job(session, submit, settings, box)
    cache = f"{settings.model_cache}/gguf-b179c952"
    await record_event(
        session,
        job["id"],
        "info",
        f"Converting m.gguf (98 MB) into a Hugging Face folder, once: later loads read {cache}",
        {"file": f"{settings.data_root}/m.gguf", "cache": cache},
    )
    failed = await submit(teacher={"base_model": "tiny-teacher", "model_path": "nothing-here"})
    await create_webhook(session, box, job["team_id"], "https://a.example/f", ["job.failed"], None)
    await claim_job(session, failed["id"], "w", heartbeat_timeout=60)
    await record_event(
        session, failed["id"], "info", f"Reading {settings.data_root}/sums.jsonl (3 rows).", None
    )
    missing = f"no sampler checkpoint at '{settings.data_root}/nothing-here': pass a path"
    await fail_job(session, failed["id"], "w", "bad_checkpoint", missing)
    sweep_id = await trial_of(session, key, job, folder)
    hooks = (await client.get("/v1/webhooks", headers=auth(key))).json()["data"]
    doors = [
        "/v1/jobs",
        "/v1/sweeps",
        f"/v1/sweeps/{sweep_id}",
        *(f"/v1/webhooks/{hook['id']}/deliveries" for hook in hooks),
    ]
    for job_id in (job["id"], failed["id"]):
        doors += [
            f"/v1/jobs/{job_id}",
            f"/v1/jobs/{job_id}/events",
            f"/v1/jobs/{job_id}/checkpoints",
        ]

    answers = {door: await client.get(door, headers=auth(key)) for door in doors}
    sign_in = await client.get("/ui/sign-in")
    await post_form(client, "/ui/sign-in", sign_in, key=key.key, next="/ui/jobs")
    pages = [
        "/ui/jobs",
        f"/ui/jobs/{job['id']}",
        f"/ui/jobs/{failed['id']}",
        f"/ui/sweeps/{sweep_id}",
    ]
    pages.append(f"/ui/compare?jobs={job['id']}&jobs={failed['id']}")
    answers |= {page: await client.get(page) for page in pages}

    assert len(hooks) == 2
    for door, answer in answers.items():
        assert answer.status_code == 200, (door, answer.status_code)
        assert MARK not in answer.text, (door, answer.text[answer.text.find(MARK) - 200 :][:400])
    error = answers[f"/v1/jobs/{failed['id']}"].json()["error"]
    assert error["message"] == "no sampler checkpoint at '[server folder]': pass a path"
    page = answers[f"/ui/sweeps/{sweep_id}"].text
    assert f"job-{job['id']}/final" in page, "the best trial's spec names the weights"
