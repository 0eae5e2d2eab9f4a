"""/v1/files on a folder store and on a bucket of moto's S3 server: an upload is checked,
reported, stored once and read back whole; a file that cannot be a dataset, or goes past a
limit, is a clear 4xx that leaves nothing in the table, the store or the spool folder; one
team never reaches another's file, in a spec either; a spec names a file by id and the
service fills in its object; a file an unfinished job reads cannot be deleted."""

from __future__ import annotations

import asyncio
import io
import json
import os
from typing import Any

import httpx
import obstore
import pyarrow
import pyarrow.parquet
import pytest
from sqlalchemy import select, update

from app.audit.tables import AuditEntry
from app.core.config import Settings
from app.core.storage import file_cache, storage_of
from app.files.schemas import row_id
from app.files.tables import UploadedFile
from app.jobs.limits import Limits
from app.jobs.tables import Job
from app.main import create_app
from app.sweeps.control import advance, claim_sweeps
from kernel.storage.blobs import blob_key
from opd.sdk import AsyncClient, ValidationError
from tests.app.conftest import auth, serve, small_spec
from tests.app.files.conftest import (
    JSONL,
    QUOTA,
    ROWS,
    objects,
    sized_jsonl,
    spooled,
    unique_jsonl,
    upload,
)
from tests.hostile_uploads import deep_jsonl


def parquet_bytes(table: dict[str, list[Any]]) -> bytes:
    out = io.BytesIO()
    pyarrow.parquet.write_table(pyarrow.table(table), out)
    return out.getvalue()


async def test_an_upload_is_reported_stored_once_and_read_back_whole(client, key, settings):
    response = await upload(client, key, JSONL)
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["id"].startswith("file-") and body["format"] == "jsonl"
    assert (body["bytes"], body["rows"]) == (len(JSONL), 4)
    report = body["report"]
    assert (report["question_field"], report["answer_field"]) == ("question", "answer")
    assert (report["empty_questions"], report["duplicate_questions"]) == (1, 1)
    assert [c["name"] for c in report["columns"]] == ["question", "answer", "level"]
    assert report["preview"][0] == ROWS[0] and len(report["preview"]) == 4

    again = await upload(client, key, JSONL, filename="copy.jsonl")
    assert (again.status_code, again.json()["id"]) == (200, body["id"])
    assert len(objects(settings)) == 1 and spooled(settings) == []

    listed = (await client.get("/v1/files", headers=auth(key))).json()
    assert [f["id"] for f in listed["data"]] == [body["id"]]
    shown = (await client.get(f"/v1/files/{body['id']}", headers=auth(key))).json()
    assert shown["report"] == report
    content = await client.get(f"/v1/files/{body['id']}/content", headers=auth(key))
    assert (content.status_code, content.content) == (200, JSONL)
    assert "train.jsonl" in content.headers["content-disposition"]


async def test_fields_may_be_given_and_csv_and_parquet_are_read(client, key):
    csv = b"prompt,ref\nWhat is 3 + 3?,6\nWhat is 4 + 4?,8\n"
    response = await upload(client, key, csv, "sums.csv", answer_field="ref")
    assert response.status_code == 201, response.text
    assert (response.json()["question_field"], response.json()["answer_field"]) == ("prompt", "ref")
    data = parquet_bytes({"problem": ["a?", "b?", None], "score": [1, 2, 3]})
    response = await upload(client, key, data, "p.parquet")
    assert response.status_code == 201, response.text
    report = response.json()["report"]
    assert (report["question_field"], report["answer_field"], report["empty_questions"]) == (
        "problem",
        None,
        1,
    )


BAD_UPLOADS = [
    (
        "not UTF-8",
        b'{"question": "caf\xe9"}\n',
        "train.jsonl",
        {},
        422,
        "not_utf8",
        "byte 17 (line 1)",
    ),
    (
        "truncated Parquet",
        parquet_bytes({"question": ["a?"] * 50})[:-40],
        "train.parquet",
        {},
        422,
        "unusable_file",
        "does not parse as parquet",
    ),
    (
        "no question column",
        b'{"x": "a", "y": "b"}\n',
        "train.jsonl",
        {},
        422,
        "unusable_file",
        "no question column",
    ),
    (
        "a field it does not have",
        JSONL,
        "train.jsonl",
        {"field": "prompt"},
        422,
        "unusable_file",
        "no column 'prompt'",
    ),
    ("not JSON", b'{"question": "a"}\n{"question": \n', "t.jsonl", {}, 422, "unusable_file", ""),
    ("only empty questions", b'{"question": ""}\n', "t.jsonl", {}, 422, "unusable_file", "empty"),
    ("no known format", JSONL, "train.txt", {}, 422, "unsupported_format", "format="),
    (
        "nested too deep",
        deep_jsonl(1000),
        "deep.jsonl",
        {},
        422,
        "file_too_complex",
        "line 1 nests objects or lists more than 64 levels deep",
    ),
    ("over the quota", JSONL * 20, "big.jsonl", {}, 413, "file_quota_exceeded", "quota of 4096"),
]


@pytest.mark.parametrize(
    ("data", "filename", "params", "status", "code", "words"),
    [case[1:] for case in BAD_UPLOADS],
    ids=[case[0] for case in BAD_UPLOADS],
)
async def test_a_bad_upload_is_a_clear_4xx_that_leaves_nothing_behind(
    client, key, settings, sessions, data, filename, params, status, code, words
):
    response = await upload(client, key, data, filename, **params)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code and words in error["message"]
    assert (await client.get("/v1/files", headers=auth(key))).json()["data"] == []
    assert objects(settings) == [] and spooled(settings) == []
    async with sessions() as session:
        query = select(AuditEntry.status_code).where(
            AuditEntry.team_id == key.team.id, AuditEntry.action == "file.upload"
        )
        assert list((await session.execute(query)).scalars()) == [status]


async def test_a_table_that_unpacks_past_four_times_the_upload_limit_is_refused(settings, key):
    data = parquet_bytes({"question": ["q" * 5000]})  # a few hundred bytes, 5 KB unpacked
    assert len(data) < 1024
    async with serve(settings.model_copy(update={"max_upload_bytes": 1024})) as client:
        response = await upload(client, key, data, "small.parquet")
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "file_too_complex"
    assert "more than the 4096 bytes this service reads of one table" in error["message"]
    assert objects(settings) == [] and spooled(settings) == []


async def test_a_streamed_body_past_the_quota_is_cut_off_without_a_length(client, key, settings):
    async def body():
        for _ in range(100):
            yield JSONL

    response = await client.post(
        "/v1/files", params={"filename": "x.jsonl"}, content=body(), headers=auth(key)
    )
    assert response.status_code == 413 and "quota" in response.json()["error"]["message"]
    assert objects(settings) == [] and spooled(settings) == []


async def test_another_teams_file_is_a_404_everywhere_a_spec_included(client, key, make_key):
    file_id = (await upload(client, key, JSONL)).json()["id"]
    beta = await make_key()
    for path in (f"/v1/files/{file_id}", f"/v1/files/{file_id}/content"):
        response = await client.get(path, headers=auth(beta))
        assert response.status_code == 404, response.text
        assert file_id in response.json()["error"]["message"]
    assert (await client.delete(f"/v1/files/{file_id}", headers=auth(beta))).status_code == 404
    assert (await client.get("/v1/files", headers=auth(beta))).json()["data"] == []
    spec = small_spec(dataset={"source": "file", "file": file_id})
    response = await client.post("/v1/jobs", json=spec, headers=auth(beta))
    assert response.status_code == 404, response.text
    assert response.json()["error"]["param"] == "dataset.file"
    missing = small_spec(dataset={"source": "file", "file": "file-999999"})
    unknown = await client.post("/v1/jobs", json=missing, headers=auth(key))
    assert unknown.status_code == 404
    assert (
        unknown.json()["error"]["message"].replace("file-999999", file_id)
        == (response.json()["error"]["message"])
    )


async def test_a_spec_names_a_file_and_the_service_fills_its_object(client, key, sessions):
    file = (await upload(client, key, JSONL)).json()
    spec = small_spec(
        dataset={"source": "file", "file": file["id"]},
        eval={"dataset": {"source": "file", "file": file["id"], "field": "answer"}},
    )
    response = await client.post("/v1/jobs", json=spec, headers=auth(key))
    assert response.status_code == 201, response.text
    stored = response.json()["spec"]
    blob = f"{file['sha256']}.jsonl"
    assert (stored["dataset"]["blob"], stored["dataset"]["field"]) == (blob, "question")
    assert stored["dataset"]["answer_field"] == "answer"
    assert (stored["eval"]["dataset"]["blob"], stored["eval"]["dataset"]["field"]) == (
        blob,
        "answer",
    )

    given = small_spec(dataset={"source": "file", "file": file["id"], "blob": blob})
    refused = await client.post("/v1/jobs", json=given, headers=auth(key))
    assert (refused.status_code, refused.json()["error"]["param"]) == (422, "dataset.blob")
    wrong = small_spec(dataset={"source": "file", "file": file["id"], "field": "nope"})
    refused = await client.post("/v1/jobs", json=wrong, headers=auth(key))
    assert (refused.status_code, refused.json()["error"]["param"]) == (422, "dataset.field")

    clone = await client.post(f"/v1/jobs/{response.json()['id']}/clone", json={}, headers=auth(key))
    assert clone.status_code == 201, clone.text
    assert clone.json()["spec"]["dataset"]["blob"] == blob


async def test_a_file_an_unfinished_job_reads_is_kept_until_the_job_ends(
    client, key, settings, sessions
):
    file_id = (await upload(client, key, unique_jsonl())).json()["id"]
    spec = small_spec(datasets=[{"source": "file", "file": file_id, "name": "mine"}])
    spec.pop("dataset", None)
    job = await client.post("/v1/jobs", json=spec, headers=auth(key))
    assert job.status_code == 201, job.text
    refused = await client.delete(f"/v1/files/{file_id}", headers=auth(key))
    assert refused.status_code == 409 and f"job {job.json()['id']}" in refused.text
    cancel = await client.post(f"/v1/jobs/{job.json()['id']}/cancel", headers=auth(key))
    assert cancel.status_code == 200, cancel.text
    async with sessions() as session:
        status = (
            await session.execute(select(Job.status).where(Job.id == job.json()["id"]))
        ).scalar()
    assert status == "cancelled"
    assert (await client.delete(f"/v1/files/{file_id}", headers=auth(key))).status_code == 204
    assert (await client.get(f"/v1/files/{file_id}", headers=auth(key))).status_code == 404
    assert objects(settings) == []


async def test_a_deleted_files_id_is_never_given_again_so_a_clone_reads_no_other_bytes(client, key):
    """Issue 47 item 10: on SQLite the next upload took the deleted last file's id, and a
    clone of the job that trained on it read the other bytes."""
    file_id = (await upload(client, key, unique_jsonl())).json()["id"]
    job = (await client.post("/v1/jobs", json=file_spec(file_id), headers=auth(key))).json()
    await client.post(f"/v1/jobs/{job['id']}/cancel", headers=auth(key))
    assert (await client.delete(f"/v1/files/{file_id}", headers=auth(key))).status_code == 204
    other = (await upload(client, key, unique_jsonl())).json()["id"]
    assert row_id(other) > row_id(file_id)

    clone = await client.post(f"/v1/jobs/{job['id']}/clone", json={}, headers=auth(key))
    assert (clone.status_code, clone.json()["error"]["param"]) == (404, "dataset.file")


async def test_a_clone_reads_the_bytes_its_job_trained_on_or_is_refused(client, key, sessions):
    file = (await upload(client, key, unique_jsonl())).json()
    job = (await client.post("/v1/jobs", json=file_spec(file["id"]), headers=auth(key))).json()
    async with sessions() as session:  # what no door does: the row names other bytes
        await session.execute(
            update(UploadedFile)
            .where(UploadedFile.id == row_id(file["id"]))
            .values(sha256="0" * 64)
        )
        await session.commit()

    clone = await client.post(f"/v1/jobs/{job['id']}/clone", json={}, headers=auth(key))
    assert (clone.status_code, clone.json()["error"]["param"]) == (422, "dataset.file")
    assert f"other bytes than job {job['id']} trained on" in clone.json()["error"]["message"]
    other = (await upload(client, key, unique_jsonl())).json()["id"]
    patched = {"dataset": {"file": other}}
    moved = await client.post(f"/v1/jobs/{job['id']}/clone", json=patched, headers=auth(key))
    assert moved.status_code == 201, moved.text


def file_spec(file_id: str) -> dict[str, Any]:
    return small_spec(dataset={"source": "file", "file": file_id})


async def test_each_team_stores_its_own_copy_so_none_learns_what_another_holds(
    client, key, make_key, settings
):
    beta, data = await make_key(), unique_jsonl()
    ours = (await upload(client, key, data)).json()["id"]
    theirs = (await upload(client, beta, data)).json()["id"]  # written, not found stored
    stored = objects(settings)
    assert ours != theirs and len(stored) == 2
    assert sorted(path.split("/")[1] for path in stored) == sorted(
        f"team-{team}" for team in (key.team.id, beta.team.id)
    )
    assert (await client.delete(f"/v1/files/{ours}", headers=auth(key))).status_code == 204
    assert [path.split("/")[1] for path in objects(settings)] == [f"team-{beta.team.id}"]
    content = await client.get(f"/v1/files/{theirs}/content", headers=auth(beta))
    assert content.content == data
    assert (await client.delete(f"/v1/files/{theirs}", headers=auth(beta))).status_code == 204
    assert objects(settings) == []


async def test_files_stored_before_per_team_names_are_still_read_and_then_removed(
    client, key, make_key, settings, sessions
):
    """An object of the shared layout (`blobs/sha256/..`), which two teams' files name: each
    team reads it (the API and a worker's cache), and it goes with the last of them."""
    beta, data = await make_key(), unique_jsonl()
    files = [(await upload(client, k, data)).json() for k in (key, beta)]
    storage = storage_of(settings)
    sha = files[0]["sha256"]
    for path in objects(settings):
        await obstore.delete_async(storage.store, path)
    await obstore.put_async(storage.store, blob_key(sha), data)
    for k, file in zip((key, beta), files, strict=True):
        content = await client.get(f"/v1/files/{file['id']}/content", headers=auth(k))
        assert (content.status_code, content.content) == (200, data)
        copy = await asyncio.to_thread(file_cache(settings, k.team.id).path, sha, ".jsonl")
        assert copy.read_bytes() == data
        copy.unlink()
    assert (
        await client.delete(f"/v1/files/{files[0]['id']}", headers=auth(key))
    ).status_code == 204
    assert objects(settings) == [blob_key(sha)]
    assert (
        await client.delete(f"/v1/files/{files[1]['id']}", headers=auth(beta))
    ).status_code == 204
    assert objects(settings) == []


async def test_a_store_that_does_not_answer_is_a_503_that_keeps_nothing(
    tmp_path, database_url, queue_name, redis, key, sessions, monkeypatch
):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    settings = Settings(
        home=tmp_path,
        database_url=database_url,
        redis_url="redis://127.0.0.1:6379/15",
        queue_name=queue_name,
        migrate_on_start=False,
        auth_cache_seconds=0,
        storage_url="s3://absent/opd",
        storage_retry_seconds=0.5,
    )
    async with serve(settings, raising=False) as client:
        response = await upload(client, key, unique_jsonl())
        assert response.status_code == 503, response.text
        assert response.json()["error"]["code"] == "storage_unavailable"
        assert (await client.get("/v1/files", headers=auth(key))).json()["data"] == []
    assert spooled(settings) == []


async def test_a_sweeps_trials_keep_the_file_and_get_its_object_again(client, key, sessions):
    file = (await upload(client, key, unique_jsonl())).json()
    definition = {
        "name": "lr",
        "base": small_spec(dataset={"source": "file", "file": file["id"]}),
        "parameters": {"optim.learning_rate": {"values": [1e-3, 3e-3]}},
        "method": "grid",
        "metric": {"name": "opd/reverse_kl_mean", "goal": "minimize"},
        "max_trials": 2,
        "parallel": 2,
    }
    response = await client.post("/v1/sweeps", json=definition, headers=auth(key))
    assert response.status_code == 201, response.text
    async with sessions() as session:
        assert response.json()["id"] in await claim_sweeps(session, "test", 60)
        created = (await advance(session, response.json()["id"], "test", Limits())).created
    assert len(created) == 2
    for job_id in created:
        job = (await client.get(f"/v1/jobs/{job_id}", headers=auth(key))).json()
        assert job["status"] == "queued", job
        dataset = job["spec"]["dataset"]
        assert (dataset["file"], dataset["blob"]) == (file["id"], f"{file['sha256']}.jsonl")


async def test_a_sweep_over_another_teams_file_is_a_404_naming_the_parameter(client, key, make_key):
    """Every probe passes a job's admission: probes alike in their weights but not in their
    file are each checked (they were de-duplicated by weights only: a 201)."""
    ours = (await upload(client, key, unique_jsonl())).json()["id"]
    beta = await make_key()
    theirs = (await upload(client, beta, unique_jsonl())).json()["id"]
    for method in ("grid", "random"):
        definition = {
            "name": "files",
            "base": small_spec(dataset={"source": "file", "file": ours}),
            "parameters": {"dataset.file": {"values": [ours, theirs]}},
            "method": method,
            "metric": {"name": "opd/reverse_kl_mean", "goal": "minimize"},
            "max_trials": 2,
        }
        response = await client.post("/v1/sweeps", json=definition, headers=auth(key))
        assert response.status_code == 404, response.text
        error = response.json()["error"]
        assert error["param"] == "parameters.dataset.file" and theirs in error["message"]
    assert (await client.get("/v1/sweeps", headers=auth(key))).json()["data"] == []


async def test_content_redirects_to_a_presigned_url_only_when_the_operator_allows(
    client, key, settings
):
    data = unique_jsonl()
    file = (await upload(client, key, data)).json()
    path = f"/v1/files/{file['id']}/content"
    answer = await client.get(path, params={"redirect": "true"}, headers=auth(key))
    assert (answer.status_code, answer.content) == (200, data)  # off: the bytes, no URL
    assert "location" not in answer.headers
    allowed = settings.model_copy(update={"presigned_downloads": True})
    async with serve(allowed) as http:
        answer = await http.get(path, params={"redirect": "true"}, headers=auth(key))
    if not storage_of(settings).remote:  # a folder has no URL of its own: the bytes come
        assert (answer.status_code, answer.content) == (200, data)
        return
    assert answer.status_code == 307 and answer.headers["etag"] == f'"{file["sha256"]}"'
    location = answer.headers.pop("location")
    assert "X-Amz-Credential=" in location and f"team-{key.team.id}" in location
    shown = json.dumps(dict(answer.headers)) + answer.text
    assert os.environ["AWS_ACCESS_KEY_ID"] not in shown and "127.0.0.1" not in shown
    fetched = httpx.get(location, timeout=10)  # no key: the URL is signed
    assert (fetched.status_code, fetched.content) == (200, data)


NAMES = [
    ("数据.jsonl", "attachment; filename=\"__.jsonl\"; filename*=UTF-8''%E6%95%B0%E6%8D%AE.jsonl"),
    (
        'say "hi" \\ bye.jsonl',
        'attachment; filename="say _hi_ _ bye.jsonl"; '
        "filename*=UTF-8''say%20%22hi%22%20%5C%20bye.jsonl",
    ),
    (
        "plain-name_1.jsonl",
        "attachment; filename=\"plain-name_1.jsonl\"; filename*=UTF-8''plain-name_1.jsonl",
    ),
]


@pytest.mark.parametrize(("filename", "disposition"), NAMES, ids=["utf-8", "quotes", "ascii"])
async def test_any_name_a_file_was_given_downloads(client, key, filename, disposition):
    data = unique_jsonl()
    file = (await upload(client, key, data, filename)).json()
    assert file["filename"] == filename
    answer = await client.get(f"/v1/files/{file['id']}/content", headers=auth(key))
    assert (answer.status_code, answer.content) == (200, data)
    assert answer.headers["content-disposition"] == disposition


@pytest.mark.parametrize(
    "filename",
    [
        "a\r\nb.jsonl",
        "a\nb.jsonl",
        "nul\x00.jsonl",
        "tab\t.jsonl",
        "del\x7f.jsonl",
        "c1\x85.jsonl",
        "c1\x9b.jsonl",
    ],
    ids=["crlf", "lf", "nul", "tab", "del", "nel", "csi"],
)
async def test_a_name_with_a_control_character_is_refused(client, key, settings, filename):
    answer = await upload(client, key, unique_jsonl(), filename)
    assert answer.status_code == 422, answer.text
    error = answer.json()["error"]
    assert (error["code"], error["param"]) == ("invalid_filename", "filename")
    assert objects(settings) == [] and spooled(settings) == []


async def test_a_name_stored_before_the_check_still_downloads(client, key, sessions):
    data = unique_jsonl()
    file = (await upload(client, key, data)).json()
    async with sessions() as session:
        await session.execute(
            update(UploadedFile)
            .where(UploadedFile.id == row_id(file["id"]))
            .values(filename="bad\r\nSet-Cookie: x=1.jsonl")
        )
        await session.commit()
    answer = await client.get(f"/v1/files/{file['id']}/content", headers=auth(key))
    assert (answer.status_code, answer.content) == (200, data)
    assert "set-cookie" not in answer.headers
    assert answer.headers["content-disposition"].startswith('attachment; filename="bad__Set-Cookie')


async def test_an_idempotency_key_makes_one_file_and_refuses_another_body(client, key):
    data, again = unique_jsonl(), {"Idempotency-Key": "upload-1"}
    first = await upload(client, key, data, headers=again)
    assert first.status_code == 201, first.text
    retry = await upload(client, key, data, headers=again)
    assert (retry.status_code, retry.json()["id"]) == (200, first.json()["id"])
    for body, filename in ((unique_jsonl(), "train.jsonl"), (data, "other.jsonl")):
        refused = await upload(client, key, body, filename, headers=again)
        assert refused.status_code == 422, refused.text
        error = refused.json()["error"]
        assert (error["code"], error["param"]) == ("idempotency_key_reused", "Idempotency-Key")
        assert first.json()["id"] in error["message"]
    listed = (await client.get("/v1/files", headers=auth(key))).json()["data"]
    assert [f["id"] for f in listed] == [first.json()["id"]]


async def test_a_retry_while_the_first_is_under_way_makes_nothing_twice(client, key):
    data, go, reached = unique_jsonl(), asyncio.Event(), []

    async def body():
        yield data[:10]
        reached.append(True)
        if len(reached) == 2:
            go.set()
        await go.wait()
        yield data[10:]

    again = {"Idempotency-Key": "in-flight"}
    answers = await asyncio.gather(*(upload(client, key, body(), headers=again) for _ in "ab"))
    assert sorted(a.status_code for a in answers) == [200, 201], [a.text for a in answers]
    assert answers[0].json()["id"] == answers[1].json()["id"]
    listed = (await client.get("/v1/files", headers=auth(key))).json()["data"]
    assert len(listed) == 1


async def test_the_sdk_sends_an_upload_again_with_one_key(settings, key, tmp_path):
    mine, other = tmp_path / "mine.jsonl", tmp_path / "other.jsonl"
    mine.write_bytes(unique_jsonl())
    other.write_bytes(unique_jsonl())
    app = create_app(settings)
    transport = httpx.ASGITransport(app)
    async with (
        app.router.lifespan_context(app),
        AsyncClient("http://opd", key.key, transport=transport) as sdk,
    ):
        first = await sdk.files.upload(mine, progress=False, idempotency_key="sdk-1")
        again = await sdk.files.upload(mine, progress=False, idempotency_key="sdk-1")
        with pytest.raises(ValidationError) as refused:
            await sdk.files.upload(other, progress=False, idempotency_key="sdk-1")
    assert again.id == first.id
    assert (refused.value.code, refused.value.param) == (
        "idempotency_key_reused",
        "Idempotency-Key",
    )


async def test_a_retry_of_a_file_that_filled_the_quota_answers_it(client, key):
    data, again = sized_jsonl(QUOTA - 100), {"Idempotency-Key": "the-big-one"}
    first = await upload(client, key, data, headers=again)
    assert first.status_code == 201, first.text
    retry = await upload(client, key, data, headers=again)
    assert (retry.status_code, retry.json()["id"]) == (200, first.json()["id"])


async def test_the_api_removes_the_spool_files_a_killed_process_left(settings):
    folder = settings.home / "uploads"
    folder.mkdir()
    (folder / "old.part").write_bytes(b"half an upload")
    os.utime(folder / "old.part", (1, 1))
    (folder / "receiving.part").write_bytes(b"another API's upload")
    async with serve(settings):
        assert spooled(settings) == ["receiving.part"]
