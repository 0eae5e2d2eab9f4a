"""Uploads at once, on SQLite and Postgres, a folder store and a bucket: concurrent uploads
of one team, through two API apps (two processes' worth of engines and spool budgets),
store no more than its quota, and exactly as many as fit when they declare their size; the
spool disk that uploads in flight hold is bounded per team and per process; a delete never
removes the object behind an upload, whichever of the two gets to the store first; a file
whose object is gone is a clear error before any status or header of content is sent."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import httpx
import obstore
import pytest
from sqlalchemy import select

from app.core.storage import storage_of
from app.core.tables import utcnow
from app.files.tables import FileClaim
from kernel.storage.blobs import Storage
from tests.app.conftest import auth, serve, small_spec
from tests.app.files.conftest import QUOTA, objects, sized_jsonl, spooled, unique_jsonl, upload

SIZE = 1400
"""Two such files fit the 4 KiB quota, three do not."""


class Gate:
    """Holds every body that reaches it until each of `expected` uploads has either
    reached it or been answered: the uploads overlap wherever the service lets them."""

    def __init__(self, expected: int) -> None:
        self.expected, self.arrived = expected, 0
        self.open = asyncio.Event()

    def arrive(self) -> None:
        self.arrived += 1
        if self.arrived >= self.expected:
            self.open.set()

    def body(self, data: bytes, reached: list[bool]) -> AsyncIterator[bytes]:
        async def chunks() -> AsyncIterator[bytes]:
            yield data[: len(data) // 2]
            reached.append(True)
            self.arrive()
            await self.open.wait()
            yield data[len(data) // 2 :]

        return chunks()

    async def send(self, client: httpx.AsyncClient, key: Any, data: bytes, declared: bool):
        reached: list[bool] = []
        headers = {"Content-Length": str(len(data))} if declared else {}
        try:
            return await upload(client, key, self.body(data, reached), headers=headers)
        finally:
            if not reached:
                self.arrive()


@pytest.mark.parametrize("declared", [True, False], ids=["declared", "streamed"])
async def test_concurrent_uploads_over_the_quota_store_no_more_than_it(settings, key, declared):
    gate, uploads = Gate(5), [sized_jsonl(SIZE) for _ in range(5)]
    async with serve(settings) as one, serve(settings) as other:
        answers = await asyncio.gather(
            *(
                gate.send(one if i % 2 else other, key, data, declared)
                for i, data in enumerate(uploads)
            )
        )
        listed = (await one.get("/v1/files", headers=auth(key))).json()["data"]
    accepted = [a for a in answers if a.status_code == 201]
    refused = [a for a in answers if a.status_code != 201]
    assert all(a.json()["error"]["code"] == "file_quota_exceeded" for a in refused), [
        a.text for a in refused
    ]
    if declared:  # each reserves its size as it starts: exactly the two that fit
        assert len(accepted) == 2
    else:  # a body of unknown size reserves ahead as it arrives: never more than fit
        assert 1 <= len(accepted) <= 2
    assert len(listed) == len(accepted) and sum(f["bytes"] for f in listed) <= QUOTA
    assert len(objects(settings)) == len(accepted) and spooled(settings) == []


async def test_a_reservation_of_a_process_that_died_holds_no_quota_for_long(
    settings, key, sessions
):
    async with sessions() as session:  # a process reserved the whole quota, then died
        lapsed = utcnow() - timedelta(seconds=1)
        session.add(FileClaim(team_id=key.team.id, kind="upload", bytes=QUOTA, expires_at=lapsed))
        await session.commit()
    async with serve(settings) as client:
        answer = await upload(client, key, sized_jsonl(SIZE))
    assert answer.status_code == 201, answer.text
    async with sessions() as session:  # and it is gone
        left = await session.execute(select(FileClaim).where(FileClaim.team_id == key.team.id))
        assert left.all() == []


async def test_the_spool_disk_of_uploads_in_flight_is_bounded_per_team_and_process(
    settings, key, make_key
):
    bounded = settings.model_copy(
        update={
            "team_max_file_bytes": 1 << 20,
            "team_max_spool_bytes": 2000,
            "max_spool_bytes": 2500,
        }
    )
    beta, data = await make_key(), sized_jsonl(SIZE)
    reached, release = asyncio.Event(), asyncio.Event()

    async def held_body() -> AsyncIterator[bytes]:
        yield data[: SIZE // 2]
        reached.set()
        await release.wait()
        yield data[SIZE // 2 :]

    async with serve(bounded) as client, serve(bounded) as another_process:
        length = {"Content-Length": str(SIZE)}
        held = asyncio.create_task(upload(client, key, held_body(), headers=length))
        await reached.wait()  # half of it spooled, the rest on its way
        second = await upload(client, key, sized_jsonl(SIZE))
        theirs = await upload(client, beta, sized_jsonl(SIZE))
        elsewhere = await upload(another_process, beta, sized_jsonl(SIZE))
        release.set()
        first = await held
        after = await upload(client, key, sized_jsonl(SIZE))
    assert first.status_code == 201, first.text
    for refused, words in ((second, "this team"), (theirs, "this API process")):
        assert refused.status_code == 429, refused.text
        assert refused.headers["retry-after"] and words in refused.json()["error"]["message"]
    assert elsewhere.status_code == 201, elsewhere.text
    assert after.status_code == 201, after.text  # what the first held was given back
    assert spooled(bounded) == []


def pause_after(monkeypatch, name: str) -> tuple[asyncio.Event, asyncio.Event]:
    """Storage.`name` (every store's) stops after its first call until `go` is set;
    `reached` is set when it gets there."""
    reached, go, real = asyncio.Event(), asyncio.Event(), getattr(Storage, name)

    async def paused(self: Storage, *args: Any, **kwargs: Any) -> Any:
        result = await real(self, *args, **kwargs)
        if not reached.is_set():
            reached.set()
            await go.wait()
        return result

    monkeypatch.setattr(Storage, name, paused)
    return reached, go


def pause_before(monkeypatch, name: str) -> tuple[asyncio.Event, asyncio.Event]:
    """Storage.`name` waits for `go` before its first call does anything."""
    reached, go, real = asyncio.Event(), asyncio.Event(), getattr(Storage, name)

    async def paused(self: Storage, *args: Any, **kwargs: Any) -> Any:
        if not reached.is_set():
            reached.set()
            await go.wait()
        return await real(self, *args, **kwargs)

    monkeypatch.setattr(Storage, name, paused)
    return reached, go


async def content_of(client, key, file_id: str) -> tuple[int, bytes]:
    answer = await client.get(f"/v1/files/{file_id}/content", headers=auth(key))
    return answer.status_code, answer.content


async def test_another_teams_delete_of_the_same_bytes_keeps_a_new_upload_whole(
    settings, key, make_key, monkeypatch
):
    beta, data = await make_key(), unique_jsonl()
    async with serve(settings, raising=False) as client:
        ours = (await upload(client, key, data)).json()["id"]
        put, go = pause_after(monkeypatch, "put_file")
        theirs = asyncio.create_task(upload(client, beta, data))
        await put.wait()  # beta's bytes are in (or were found in) the store, not yet recorded
        deleted = await client.delete(f"/v1/files/{ours}", headers=auth(key))
        go.set()
        answer = await theirs
        assert (deleted.status_code, answer.status_code) == (204, 201), answer.text
        assert await content_of(client, beta, answer.json()["id"]) == (200, data)


async def test_a_delete_after_an_upload_of_the_same_bytes_began_keeps_them(
    settings, key, monkeypatch
):
    data = unique_jsonl()
    async with serve(settings, raising=False) as client:
        first = (await upload(client, key, data)).json()["id"]
        put, go = pause_after(monkeypatch, "put_file")
        other_fields = asyncio.create_task(upload(client, key, data, field="answer"))
        await put.wait()
        deleted = await client.delete(f"/v1/files/{first}", headers=auth(key))
        go.set()
        answer = await other_fields
        assert (deleted.status_code, answer.status_code) == (204, 201), answer.text
        assert await content_of(client, key, answer.json()["id"]) == (200, data)
        assert len(objects(settings)) == 1


async def test_an_upload_waits_for_a_delete_of_the_same_bytes_under_way(settings, key, monkeypatch):
    import app.files.claims as claims

    waiting, real_wait = asyncio.Event(), claims.wait_for_deletion

    async def observed(*args: Any) -> Any:
        waiting.set()
        return await real_wait(*args)

    monkeypatch.setattr(claims, "wait_for_deletion", observed)
    data = unique_jsonl()
    async with serve(settings, raising=False) as client:
        first = (await upload(client, key, data)).json()["id"]
        deleting, go = pause_before(monkeypatch, "delete")
        deletion = asyncio.create_task(client.delete(f"/v1/files/{first}", headers=auth(key)))
        await deleting.wait()  # recorded, its object about to go
        other_fields = asyncio.create_task(upload(client, key, data, field="answer"))
        await asyncio.wait(
            [other_fields, asyncio.create_task(waiting.wait())],
            return_when=asyncio.FIRST_COMPLETED,
        )
        assert waiting.is_set() and not other_fields.done()  # it waits for the delete
        go.set()
        assert (await deletion).status_code == 204
        answer = await other_fields
        assert answer.status_code == 201, answer.text
        assert await content_of(client, key, answer.json()["id"]) == (200, data)


async def test_content_whose_object_is_gone_is_an_error_not_an_empty_200(settings, key):
    data = unique_jsonl()
    async with serve(settings, raising=False) as client:
        file = (await upload(client, key, data)).json()
        for path in objects(settings):
            await obstore.delete_async(storage_of(settings).store, path)
        answer = await client.get(f"/v1/files/{file['id']}/content", headers=auth(key))
    assert answer.status_code == 410, (answer.status_code, answer.content)
    error = answer.json()["error"]
    assert error["code"] == "content_missing" and file["id"] in error["message"]


def pause_in_delete(monkeypatch) -> tuple[asyncio.Event, asyncio.Event]:
    """A delete stops once its row is unlisted (not yet committed), before it looks for
    the jobs that read the file, until `go` is set; `reached` is set when it gets there."""
    import app.jobs.uploads as uploads

    reached, go, real = asyncio.Event(), asyncio.Event(), uploads.jobs_reading

    async def paused(*args: Any) -> Any:
        reached.set()
        await go.wait()
        return await real(*args)

    monkeypatch.setattr(uploads, "jobs_reading", paused)
    return reached, go


async def test_an_upload_of_the_bytes_a_delete_is_removing_answers_a_file_that_exists(
    settings, key, monkeypatch
):
    """The upload finds the same bytes' file under the lock the delete holds: it waits, and
    makes a new file, instead of answering 200 with the file the delete then removes."""
    data = unique_jsonl()
    async with serve(settings, raising=False) as client:
        first = (await upload(client, key, data)).json()["id"]
        unlisted, go = pause_in_delete(monkeypatch)
        deletion = asyncio.create_task(client.delete(f"/v1/files/{first}", headers=auth(key)))
        await unlisted.wait()
        again = asyncio.create_task(upload(client, key, data))
        await asyncio.sleep(0.5)  # the upload reaches the lock (or its answer, unlocked)
        go.set()
        assert (await deletion).status_code == 204
        answer = await again
        assert answer.status_code == 201, answer.text  # a new file, not the one deleted
        assert await content_of(client, key, answer.json()["id"]) == (200, data)


async def test_a_job_submitted_while_its_file_is_deleted_is_refused_or_refuses_the_delete(
    settings, key, monkeypatch
):
    """Admission checks the file again under the lock the delete holds, once the job's row
    is written: the delete ran first, so the job is the 404 of a file that is not there
    (not a 201 whose job then fails `dataset_unavailable`)."""
    async with serve(settings, raising=False) as client:
        file_id = (await upload(client, key, unique_jsonl())).json()["id"]
        unlisted, go = pause_in_delete(monkeypatch)
        deletion = asyncio.create_task(client.delete(f"/v1/files/{file_id}", headers=auth(key)))
        await unlisted.wait()
        spec = small_spec(dataset={"source": "file", "file": file_id})
        submitted = asyncio.create_task(client.post("/v1/jobs", json=spec, headers=auth(key)))
        await asyncio.sleep(0.5)  # admission reaches the lock (or commits, unlocked)
        go.set()
        deleted, job = await deletion, await submitted
        assert (deleted.status_code, job.status_code) == (204, 404), job.text
        assert job.json()["error"]["param"] == "dataset.file"
        listed = await client.get("/v1/jobs", headers=auth(key))
        assert listed.json()["data"] == [], "nothing was stored"
