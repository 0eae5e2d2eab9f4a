"""POST /v1/files as OpenAI's upload form (multipart/form-data: `file`, `purpose`), on
SQLite and Postgres, a folder store and a bucket: the official `openai` package uploads a
dataset that a job spec then names; the form's file streams through the raw body's path
(a form past the quota is cut off as it arrives), its fields say how to read the file as
the query parameters do; a form the service cannot read, or one with a field it does not
take, is a clear 4xx that keeps nothing; the OpenAPI document describes both bodies."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select

from app.audit.tables import AuditEntry
from app.core.config import Settings
from app.files.form import MAX_FORM_BYTES
from app.main import create_app
from tests.app.conftest import auth, small_spec
from tests.app.files.conftest import JSONL, QUOTA, objects, spooled, unique_jsonl, upload

BOUNDARY = "opd-form-boundary"
FORM_TYPE = {"Content-Type": f"multipart/form-data; boundary={BOUNDARY}"}
Part = tuple[str, str | None, bytes]
"""A form part: its name, its filename (None: a text field), its bytes."""


def part_head(name: str, filename: str | None = None) -> bytes:
    named = f'form-data; name="{name}"' + ("" if filename is None else f'; filename="{filename}"')
    return f"--{BOUNDARY}\r\nContent-Disposition: {named}\r\n\r\n".encode()


def form_of(*parts: Part, closed: bool = True) -> bytes:
    """The parts as a multipart/form-data body, written out by hand (to send it wrong)."""
    body = b"".join(part_head(name, filename) + data + b"\r\n" for name, filename, data in parts)
    return body + (f"--{BOUNDARY}--\r\n".encode() if closed else b"")


def the_file(data: bytes = JSONL, filename: str | None = "train.jsonl") -> Part:
    return ("file", filename, data)


async def send_form(client, key, body, params=None, headers=None) -> httpx.Response:
    return await client.post(
        "/v1/files", params=params, content=body, headers=auth(key) | FORM_TYPE | (headers or {})
    )


async def nothing_kept(client, key, settings) -> None:
    assert (await client.get("/v1/files", headers=auth(key))).json()["data"] == []
    assert objects(settings) == [] and spooled(settings) == []


async def test_the_openai_package_uploads_a_dataset_that_a_job_then_names(
    openai_client, client, key, tmp_path: Path
):
    data = unique_jsonl()
    path = tmp_path / "train.jsonl"
    path.write_bytes(data)
    with path.open("rb") as file:
        uploaded = await openai_client.files.create(file=file, purpose="fine-tune")
    assert uploaded.id.startswith("file-") and uploaded.object == "file"
    assert (uploaded.filename, uploaded.bytes) == ("train.jsonl", len(data))
    assert (uploaded.purpose, uploaded.status) == ("fine-tune", "processed")
    assert uploaded.model_extra is not None and uploaded.model_extra["rows"] == 5

    content = await client.get(f"/v1/files/{uploaded.id}/content", headers=auth(key))
    assert (content.status_code, content.content) == (200, data)
    raw_again = await upload(client, key, data, filename="again.jsonl")
    assert (raw_again.status_code, raw_again.json()["id"]) == (200, uploaded.id)
    assert raw_again.json()["purpose"] == "fine-tune"  # the file's, as the form gave it

    spec = small_spec(dataset={"source": "file", "file": uploaded.id})
    job = await client.post("/v1/jobs", json=spec, headers=auth(key))
    assert job.status_code == 201, job.text
    assert job.json()["spec"]["dataset"]["field"] == "question"

    csv = ("sums.csv", b"prompt,ref\nWhat is 3 + 3?,6\n")  # the fields: OpenAI's extra_body
    fields = {"field": "prompt", "answer_field": "ref"}
    sums = await openai_client.files.create(file=csv, purpose="fine-tune", extra_body=fields)
    assert sums.model_extra is not None
    assert (sums.model_extra["question_field"], sums.model_extra["answer_field"]) == (
        "prompt",
        "ref",
    )


async def test_the_openai_package_lists_pages_and_retrieves_files_as_openais(
    openai_client, client, key, make_key
):
    """`client.files.list()` pages with `after=<the last id>` while `has_more` (it got a 422
    before the list had OpenAI's shape), `order` and `purpose` filter as OpenAI's do, and
    `files.retrieve` reads the file's purpose and status."""
    purposes = ["fine-tune", "batch", "fine-tune", "user_data", "fine-tune"]
    made = [
        await openai_client.files.create(file=(f"t{n}.jsonl", unique_jsonl()), purpose=purpose)
        for n, purpose in enumerate(purposes)
    ]
    other = await make_key()
    await upload(client, other, unique_jsonl(), filename="theirs.jsonl")
    newest_first = [file.id for file in reversed(made)]

    first = await openai_client.files.list(limit=2)
    assert [file.id for file in first.data] == newest_first[:2] and first.has_more
    assert [file.id async for file in openai_client.files.list(limit=2)] == newest_first
    oldest = [file.id async for file in openai_client.files.list(limit=2, order="asc")]
    assert oldest == newest_first[::-1]
    fine_tune = [file.id async for file in openai_client.files.list(purpose="fine-tune")]
    assert fine_tune == [made[4].id, made[2].id, made[0].id]

    page = (await client.get("/v1/files", params={"limit": 2}, headers=auth(key))).json()
    assert (page["object"], page["has_more"]) == ("list", True)
    assert (page["first_id"], page["last_id"]) == tuple(newest_first[:2])
    last = await client.get(
        "/v1/files", params={"limit": 2, "after": newest_first[3]}, headers=auth(key)
    )
    assert [file["id"] for file in last.json()["data"]] == newest_first[4:]
    assert last.json()["has_more"] is False and last.json()["last_id"] == newest_first[4]
    bad = await client.get("/v1/files", params={"after": "file-x"}, headers=auth(key))
    assert bad.status_code == 422 and bad.json()["error"]["param"] == "after"

    batch = await openai_client.files.retrieve(made[1].id)
    assert (batch.object, batch.purpose, batch.status) == ("file", "batch", "processed")
    assert (batch.filename, batch.bytes) == ("t1.jsonl", made[1].bytes)


async def test_form_fields_and_query_parameters_say_how_to_read_the_file(client, key):
    csv = b"prompt,ref\nWhat is 3 + 3?,6\nWhat is 4 + 4?,8\n"
    body = form_of(("format", None, b"csv"), ("field", None, b"prompt"), the_file(csv, "sums.txt"))
    answer = await send_form(client, key, body, params={"answer_field": "ref"})
    assert answer.status_code == 201, answer.text
    file = answer.json()
    assert (file["format"], file["question_field"], file["answer_field"]) == (
        "csv",
        "prompt",
        "ref",
    )
    assert (file["filename"], file["purpose"]) == ("sums.txt", "fine-tune")  # none sent

    named = form_of(the_file(unique_jsonl(), "upload"), ("purpose", None, b"batch"))
    answer = await send_form(client, key, named, params={"filename": "named.jsonl"})
    assert answer.status_code == 201, answer.text
    assert (answer.json()["filename"], answer.json()["purpose"]) == ("named.jsonl", "batch")


async def test_a_form_retried_with_its_idempotency_key_makes_one_file(client, key):
    again = {"Idempotency-Key": "form-1"}
    body = form_of(("purpose", None, b"fine-tune"), the_file(unique_jsonl()))
    first = await send_form(client, key, body, headers=again)
    retry = await send_form(client, key, body, headers=again)
    assert (first.status_code, retry.status_code) == (201, 200), retry.text
    assert retry.json()["id"] == first.json()["id"]


async def test_a_form_past_the_quota_is_refused_while_it_arrives(client, key, settings, sessions):
    sent: list[int] = []

    async def body() -> AsyncIterator[bytes]:
        yield form_of(("purpose", None, b"fine-tune"), closed=False) + part_head("file", "x.jsonl")
        for _ in range(1000):  # 1000 x the quota's 4 KiB in all
            sent.append(len(JSONL))
            yield JSONL * 20
        yield f"\r\n--{BOUNDARY}--\r\n".encode()

    answer = await send_form(client, key, body())
    assert answer.status_code == 413, answer.text
    error = answer.json()["error"]
    assert error["code"] == "file_quota_exceeded" and f"quota of {QUOTA}" in error["message"]
    assert len(sent) < 10, "cut off as it arrived, not read to its end"
    await nothing_kept(client, key, settings)
    async with sessions() as session:
        query = select(AuditEntry.status_code).where(
            AuditEntry.team_id == key.team.id, AuditEntry.action == "file.upload"
        )
        assert list((await session.execute(query)).scalars()) == [413]


@dataclass(frozen=True)
class Refused:
    """A form and the answer it gets: its status, code, param and words of its message."""

    body: bytes
    status: int
    code: str
    param: str | None
    words: str
    headers: dict[str, str] = field(default_factory=dict)
    params: dict[str, str] = field(default_factory=dict)


UNREADABLE, UNTAKEN = (400, "invalid_form"), (422, "invalid_form")
NAMELESS_PART = f"--{BOUNDARY}\r\nX: y\r\n\r\nz\r\n".encode()
AFTER = ("expires_after[anchor]", None, b"x")
BAD_FORMS = {
    "no boundary": Refused(
        form_of(the_file()),
        *UNREADABLE,
        None,
        "names no boundary",
        headers={"Content-Type": "multipart/form-data"},
    ),
    "not a form": Refused(b"just some bytes\r\n", *UNREADABLE, None, "not a readable form"),
    "cut short": Refused(form_of(the_file(), closed=False), *UNREADABLE, None, "ends before"),
    "cut in a field": Refused(form_of(the_file())[:30], *UNREADABLE, None, "ends"),
    "a part without a name": Refused(NAMELESS_PART, *UNREADABLE, None, "name="),
    "no file part": Refused(form_of(("purpose", None, b"x")), *UNTAKEN, "file", "no `file`"),
    "an unknown field": Refused(form_of(AFTER, the_file()), *UNTAKEN, AFTER[0], "`purpose`"),
    "one after the file": Refused(form_of(the_file(), AFTER), *UNTAKEN, AFTER[0], "it takes"),
    "two files": Refused(
        form_of(the_file(), the_file(unique_jsonl())), *UNTAKEN, "file", "two `file` parts"
    ),
    "a field after the file": Refused(
        form_of(the_file(), ("field", None, b"q")), *UNTAKEN, "field", "before the `file` part"
    ),
    "a field twice": Refused(
        form_of(("purpose", None, b"a"), the_file(), ("purpose", None, b"b")),
        *UNTAKEN,
        "purpose",
        "given twice",
    ),
    "in the form and the query": Refused(
        form_of(("field", None, b"q"), the_file()),
        *UNTAKEN,
        "field",
        "give it once",
        params={"field": "q"},
    ),
    "an unknown format": Refused(
        form_of(("format", None, b"txt"), the_file()), 422, "invalid_request", "format", "'csv'"
    ),
    "an empty field": Refused(
        form_of(("answer_field", None, b""), the_file()),
        422,
        "invalid_request",
        "answer_field",
        "at least 1 character",
    ),
    "no file name": Refused(
        form_of(the_file(filename=None)), 422, "invalid_request", "filename", "no filename"
    ),
    "a control character": Refused(
        form_of(the_file(filename="a\tb.jsonl")), 422, "invalid_filename", "filename", "U+0009"
    ),
    "a name not UTF-8": Refused(
        form_of(the_file()).replace(b"train", b"caf\xe9"), *UNTAKEN, "filename", "not UTF-8"
    ),
    "fields past the bound": Refused(
        form_of(("field", None, b"q" * MAX_FORM_BYTES), the_file()),
        *UNTAKEN,
        None,
        f"more than {MAX_FORM_BYTES} bytes",
    ),
}


@pytest.mark.parametrize("refused", BAD_FORMS.values(), ids=BAD_FORMS.keys())
async def test_a_form_the_service_cannot_take_is_a_clear_4xx_that_keeps_nothing(
    client, key, settings, refused: Refused
):
    answer = await send_form(client, key, refused.body, refused.params, refused.headers)
    assert answer.status_code == refused.status, answer.text
    error = answer.json()["error"]
    assert (error["code"], error["param"]) == (refused.code, refused.param), error
    assert refused.words in error["message"], error
    await nothing_kept(client, key, settings)


async def test_a_raw_body_still_needs_its_file_name(client, key, settings):
    answer = await client.post("/v1/files", content=JSONL, headers=auth(key))
    assert answer.status_code == 422, answer.text
    assert answer.json()["error"]["param"] == "filename"
    await nothing_kept(client, key, settings)


def test_the_openapi_document_describes_both_bodies(tmp_path: Path):
    document = create_app(Settings(home=tmp_path, migrate_on_start=False)).openapi()
    body = document["paths"]["/v1/files"]["post"]["requestBody"]["content"]
    assert body["application/octet-stream"]["schema"]["format"] == "binary"
    form = body["multipart/form-data"]["schema"]
    assert form["required"] == ["file"] and form["additionalProperties"] is False
    assert form["properties"]["file"] == form["properties"]["file"] | {"format": "binary"}
    assert set(form["properties"]) == {
        "file",
        "purpose",
        "format",
        "field",
        "answer_field",
        "model",
    }
    answers = document["paths"]["/v1/files"]["post"]["responses"]["201"]["content"]
    assert answers["application/json"]["schema"]["$ref"].endswith("/FileDetail")
