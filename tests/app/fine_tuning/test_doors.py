"""OpenAI's fine-tuning doors with the official `openai` package as the client, no worker
running, on SQLite and Postgres: a job created from an uploaded file and the distillation
method is a job of the rest of the API (its spec, its audit entry, its queue), listed with
the team's other jobs, paged newest first; it is cancelled, its events and checkpoints read
in OpenAI's shapes; every refusal is OpenAI's, naming the request's field. With real
processes and a trained job: tests/e2e/test_fine_tuning.py."""

from __future__ import annotations

from typing import Any

import openai
import pytest
from sqlalchemy import select

from app.audit.tables import AuditEntry
from app.jobs.store import claim_job
from app.records.store import record_checkpoint, record_step
from tests.app.conftest import auth
from tests.chats import OPENAI_EACH, OPENAI_FILE, jsonl_bytes

DISTILLATION = {
    "type": "distillation",
    "distillation": {
        "teacher": {"base_model": "arith-teacher"},
        "dataset": {"turns": "each"},
        "hyperparameters": {"n_epochs": 2, "batch_size": 4, "learning_rate_multiplier": 0.5},
    },
}


TINY_JOB = {
    "backend": "local",
    "student": {"base_model": "tiny-student"},
    "teacher": {"base_model": "tiny-teacher"},
    "dataset": {"source": "inline", "prompts": ["What is 1 + 1?"]},
}


@pytest.fixture
async def training_file(openai_client) -> str:
    uploaded = await openai_client.files.create(
        file=("train.jsonl", jsonl_bytes(OPENAI_FILE)), purpose="fine-tune"
    )
    return uploaded.id


async def create(openai_client, file: str, **fields: Any):
    asked = {"model": "arith-student", "training_file": file, "method": DISTILLATION}
    return await openai_client.fine_tuning.jobs.create(**(asked | fields))


async def test_a_job_created_through_the_door_is_a_job_like_any_other(
    openai_client, client, key, session, training_file
):
    made = await create(
        openai_client, training_file, suffix="chats", seed=7, metadata={"team": "math"}
    )
    assert made.object == "fine_tuning.job" and made.id.startswith("ftjob-")
    assert (made.status, made.model, made.training_file) == (
        "queued",
        "arith-student",
        training_file,
    )
    assert (made.fine_tuned_model, made.trained_tokens, made.seed) == (None, None, 7)
    assert made.hyperparameters.batch_size == 4
    assert (
        made.hyperparameters.n_epochs == 2.0
        and made.hyperparameters.learning_rate_multiplier == 0.5
    )
    assert made.method.type == "distillation" and made.metadata == {"team": "math"}

    job_id = int(made.id.removeprefix("ftjob-"))
    job = (await client.get(f"/v1/jobs/{job_id}", headers=auth(key))).json()
    spec = job["spec"]
    assert (spec["name"], spec["student"], job["status"]) == (
        "chats",
        spec["student"] | {"base_model": "arith-student", "seed": 7},
        "queued",
    )
    assert spec["dataset"]["file"] == training_file and spec["dataset"]["turns"] == "each"
    assert spec["loop"]["steps"] == 2 * OPENAI_EACH // 4 and spec["loop"]["batch_size"] == 4
    assert spec["optim"]["learning_rate"] == pytest.approx(0.5 * 3e-3)
    entries = (await session.execute(select(AuditEntry.action, AuditEntry.target))).all()
    assert ("job.create", f"job {job_id}") in entries

    assert (
        await openai_client.fine_tuning.jobs.retrieve(made.id)
    ).model_dump() == made.model_dump()


async def test_every_job_of_the_team_is_listed_newest_first_page_by_page(
    openai_client, client, key, make_key, training_file
):
    mine = [await create(openai_client, training_file) for _ in range(2)]
    elsewhere = await client.post(
        "/v1/jobs",
        json={
            "backend": "local",
            "student": {"base_model": "arith-student"},
            "teacher": {"base_model": "arith-teacher"},
            "dataset": {"source": "arithmetic"},
        },
        headers=auth(key),
    )
    stranger = await client.post("/v1/jobs", json=TINY_JOB, headers=auth(await make_key()))
    assert stranger.status_code == 201

    first = await openai_client.fine_tuning.jobs.list(limit=2)
    assert first.has_more and [job.id for job in first.data] == [
        f"ftjob-{elsewhere.json()['id']}",
        mine[1].id,
    ]
    assert first.data[0].training_file is None and first.data[0].hyperparameters.n_epochs == "auto"
    listed = [job.id async for job in openai_client.fine_tuning.jobs.list(limit=1)]
    assert listed == [f"ftjob-{elsewhere.json()['id']}", mine[1].id, mine[0].id]
    labelled = await openai_client.fine_tuning.jobs.list(metadata={"absent": "x"})
    assert labelled.data == []


async def test_a_job_is_cancelled_and_its_events_and_checkpoints_read_in_openais_shapes(
    openai_client, session, training_file
):
    made = await create(openai_client, training_file)
    job_id = int(made.id.removeprefix("ftjob-"))
    await claim_job(session, job_id, "w", heartbeat_timeout=60)
    for step in range(2):
        await record_step(session, job_id, "w", step, {"opd/reverse_kl_mean": 0.5 - step / 10})
    await record_checkpoint(session, job_id, "w", 2, "sampler", "/w/2")
    await record_checkpoint(session, job_id, "w", 2, "state", "/w/state-2")

    (saved,) = (await openai_client.fine_tuning.jobs.checkpoints.list(made.id)).data
    assert saved.object == "fine_tuning.job.checkpoint" and saved.id.startswith("ftckpt-")
    assert (saved.fine_tuned_model_checkpoint, saved.step_number) == (f"job-{job_id}@step-2", 2)
    assert saved.fine_tuning_job_id == made.id and saved.metrics.step == 2
    assert saved.metrics.model_extra == {"opd/reverse_kl_mean": pytest.approx(0.4)}

    cancelling = await openai_client.fine_tuning.jobs.cancel(made.id)
    assert cancelling.status == "running"  # a running job stops at its next step boundary
    events = await openai_client.fine_tuning.jobs.list_events(made.id, limit=100)
    assert events.data and all(e.object == "fine_tuning.job.event" for e in events.data)
    assert [e.id for e in events.data] == sorted(
        (e.id for e in events.data), key=lambda i: -int(i.removeprefix("ftevent-"))
    )
    assert {e.level for e in events.data} <= {"info", "warn", "error"}
    older = await openai_client.fine_tuning.jobs.list_events(made.id, after=events.data[0].id)
    assert [e.id for e in older.data] == [e.id for e in events.data[1:]][: len(older.data)]

    queued = await create(openai_client, training_file)
    cancelled = await openai_client.fine_tuning.jobs.cancel(queued.id)
    assert cancelled.status == "cancelled" and cancelled.finished_at is not None
    assert (await openai_client.fine_tuning.jobs.cancel(queued.id)).status == "cancelled"
    paused = await openai_client.fine_tuning.jobs.pause(
        (await create(openai_client, training_file)).id
    )
    assert paused.status == "paused"
    assert (await openai_client.fine_tuning.jobs.resume(paused.id)).status == "queued"


@pytest.mark.parametrize(
    ("fields", "status", "param", "words"),
    [
        (
            {"method": {"type": "supervised", "supervised": {}}},
            400,
            "method.type",
            "this service distils",
        ),
        ({"method": None}, 400, "method", "this service distils"),
        (
            {"method": {"type": "distillation", "distillation": {"dataset": {"turns": "each"}}}},
            400,
            "method.distillation.teacher",
            "required",
        ),
        (
            {
                "method": {
                    "type": "distillation",
                    "distillation": {
                        "teacher": {"base_model": "arith-teacher"},
                        "student": {"base_model": "tiny-student"},
                    },
                }
            },
            400,
            "method.distillation.student.base_model",
            "is `model`'s to say",
        ),
        ({"model": "gpt-4o-mini"}, 400, "model", "no built-in preset"),
        ({"training_file": "file-999999"}, 404, "training_file", "not one of your team's files"),
        ({"training_file": "file-abc"}, 400, "training_file", "should match"),
        (
            {"validation_file": "file-999999"},
            404,
            "validation_file",
            "not one of your team's files",
        ),
        ({"hyperparameters": {"n_epochs": 0}}, 400, "hyperparameters.n_epochs", ""),
        ({"integrations": [{"type": "wandb"}]}, 400, "integrations", "trackers"),
    ],
)
async def test_a_refusal_is_openais_and_names_the_requests_field(
    openai_client, training_file, fields, status, param, words
):
    body = {k: v for k, v in fields.items() if v is not None}
    if fields.get("method", DISTILLATION) is None:
        body["method"] = openai.NOT_GIVEN
    with pytest.raises(openai.APIStatusError) as refused:
        await create(openai_client, training_file, **body)
    error = refused.value
    assert (error.status_code, error.param) == (status, param), error.body
    assert words in str(error.body["message"])  # type: ignore[index]


async def test_another_teams_job_reads_as_no_job(openai_client, client, make_key, training_file):
    stranger = await client.post("/v1/jobs", json=TINY_JOB, headers=auth(await make_key()))
    theirs = f"ftjob-{stranger.json()['id']}"
    for read in (
        openai_client.fine_tuning.jobs.retrieve,
        openai_client.fine_tuning.jobs.cancel,
        openai_client.fine_tuning.jobs.list_events,
        openai_client.fine_tuning.jobs.checkpoints.list,
    ):
        for asked in (theirs, "ftjob-99999999", "job-1"):
            with pytest.raises(openai.NotFoundError) as missing:
                await read(asked)
            assert missing.value.param == "fine_tuning_job_id"
    with pytest.raises(openai.BadRequestError) as bad:
        await openai_client.fine_tuning.jobs.list(after="job-3")
    assert bad.value.param == "after"
