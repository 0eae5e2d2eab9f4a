"""The Files pages over HTTP: a file uploaded from the page (its body the file, the form's
CSRF token in a header) shows in the list and on its report page with its preview; a
refused upload answers why and keeps nothing; the New job page offers the upload; a read
key sees the pages but not the upload; another team's file is a 404; delete is refused
while a job reads the file."""

from __future__ import annotations

import json

from app.auth.schemas import Scope
from tests.app.conftest import auth, small_spec
from tests.app.web.conftest import csrf_of, post_form
from tests.chats import INVALID_LINES, OPENAI_EACH, OPENAI_FILE, jsonl_bytes

DATA = (
    "".join(
        json.dumps({"question": f"What is {i} + {i}?", "answer": str(2 * i)}) + "\n"
        for i in range(6)
    )
    + json.dumps({"question": "", "answer": "-"})
    + "\n"
).encode()


async def upload(client, page, data: bytes = DATA, filename: str = "web.jsonl"):
    return await client.post(
        "/ui/files/upload",
        params={"filename": filename},
        content=data,
        headers={"X-CSRF-Token": csrf_of(page)},
    )


async def test_a_file_uploaded_from_the_page_shows_its_report(client, key, sign_in):
    await sign_in(key)
    page = await client.get("/ui/files")
    assert page.status_code == 200 and 'id="upload-file"' in page.text
    new_job = await client.get("/ui/new")
    assert 'id="upload-file"' in new_job.text

    answer = await upload(client, page)
    assert answer.status_code == 200, answer.text
    file_id = answer.json()["id"]
    assert answer.json()["url"] == f"/ui/files/{file_id}"
    listed = await client.get("/ui/files")
    assert f'data-file-id="{file_id}"' in listed.text and "web.jsonl" in listed.text
    report = await client.get(f"/ui/files/{file_id}")
    assert report.status_code == 200
    assert '<td class="num" id="file-rows">7</td>' in report.text
    assert '<td class="num" id="empty-questions">1</td>' in report.text
    assert "What is 3 + 3?" in report.text
    assert f"dataset: {{source: file, file: {file_id}}}" in report.text

    deleted = await post_form(client, f"/ui/files/{file_id}/delete", report)
    assert deleted.status_code == 303
    assert (await client.get(f"/ui/files/{file_id}")).status_code == 404


async def test_a_refused_upload_says_why_and_keeps_nothing(client, key, sign_in):
    await sign_in(key)
    page = await client.get("/ui/files")
    refused = await upload(client, page, b'{"x": "a", "y": "b"}\n', "bad.jsonl")
    assert refused.status_code == 422 and "no question column" in refused.json()["error"]
    forged = await client.post(
        "/ui/files/upload", params={"filename": "a.jsonl"}, content=DATA, headers={}
    )
    assert forged.status_code == 403
    assert (await client.get("/v1/files", headers=auth(key))).json()["data"] == []


async def test_a_file_a_job_reads_is_not_deleted_and_other_teams_see_nothing(
    client, key, make_key, sign_in
):
    await sign_in(key)
    page = await client.get("/ui/files")
    file_id = (await upload(client, page)).json()["id"]
    spec = small_spec(dataset={"source": "file", "file": file_id})
    assert (await client.post("/v1/jobs", json=spec, headers=auth(key))).status_code == 201
    report = await client.get(f"/ui/files/{file_id}")
    refused = await post_form(client, f"/ui/files/{file_id}/delete", report)
    assert refused.status_code == 409 and "unfinished jobs" in refused.text

    await sign_in(await make_key())
    assert (await client.get(f"/ui/files/{file_id}")).status_code == 404
    assert file_id not in (await client.get("/ui/files")).text


async def test_a_read_key_sees_the_pages_but_not_the_upload(client, make_key, sign_in):
    await sign_in(await make_key(scope=Scope.read))
    page = await client.get("/ui/files")
    assert page.status_code == 200 and 'id="upload-file"' not in page.text
    assert (await upload(client, page)).status_code == 403


async def test_a_file_of_conversations_shows_what_they_hold_and_a_bad_one_its_lines(
    client, key, sign_in
):
    await sign_in(key)
    page = await client.get("/ui/files")
    answer = await upload(client, page, jsonl_bytes(OPENAI_FILE), "chats.jsonl")
    assert answer.status_code == 200, answer.text
    report = await client.get(answer.json()["url"])
    assert (
        "<code>messages</code>: 6 conversations, 3 system, 8 user, 9 assistant, 1 tool"
        in report.text
    )
    assert f"{len(OPENAI_FILE)} with <code>turns: last</code>, {OPENAI_EACH} with" in report.text
    refused = await upload(
        client, page, jsonl_bytes([OPENAI_FILE[0], INVALID_LINES[0][0]]), "b.jsonl"
    )
    assert refused.status_code == 422 and "line 2: messages.0.role" in refused.json()["error"]
