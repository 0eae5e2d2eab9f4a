"""Uploaded datasets over the network, with real processes: the API and a worker that
share no folder (each its own OPD_HOME) and one bucket of moto's S3 server. A team
uploads a JSONL through the SDK (and looks at it with the CLI), trains on it by id, and
another team reaches neither the file nor its use in a spec; the official `openai`
package uploads one too, which a spec then names."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from opd import Client, NotFound
from tests.e2e.conftest import Service, deployment, tiny_spec
from tests.support import temporary_bucket

QUESTIONS = [f"What is {a} + {b}?" for a in range(4) for b in range(3)]


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    (tmp_path / "api").mkdir()
    with (
        temporary_bucket() as bucket,
        deployment(
            tmp_path / "api", f"sqlite:///{tmp_path / 'opd.db'}", storage_url=bucket
        ) as running,
    ):
        yield running


def test_a_team_trains_on_a_file_it_uploaded_and_no_other_team_reaches_it(
    service, tmp_path, capsys
):
    data = tmp_path / "mine.jsonl"
    rows = [{"prompt": q, "answer": str(i)} for i, q in enumerate(QUESTIONS)]
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    with Client(service.url, service.key) as client:
        file = client.files.upload(data)
        assert "uploading mine.jsonl" in capsys.readouterr().err
        assert (file.rows, file.report.question_field, file.report.answer_field) == (
            12,
            "prompt",
            "answer",
        )
        assert [listed.id for listed in client.files.list()] == [file.id]
        fetched = client.files.download(file.id, tmp_path / "back.jsonl")
        assert fetched.path.read_bytes() == data.read_bytes() and fetched.sha256 == file.sha256
    shown = service.opd("files", "show", file.id, "--url", service.url, "--key", service.key).stdout
    assert "question=prompt answer=answer" in shown and "What is 0 + 0?" in shown

    worker_home = tmp_path / "worker"  # no folder in common with the API's home
    service.start_worker(OPD_HOME=str(worker_home))
    spec = tiny_spec(steps=2) | {"dataset": {"source": "file", "file": file.id}}
    job = service.submit(spec)
    done = service.wait(job["id"])
    assert done["status"] == "succeeded", service.logs()
    loaded = [e.message for e in service.events(job["id"]) if e.message.startswith("Loaded")]
    assert loaded == ["Loaded 12 prompts from file"]
    assert [p.suffix for p in (worker_home / "cache" / "files").iterdir()] == [".jsonl"]

    beta = service.opd("keys", "create", "--team", "beta").stdout.strip()
    with Client(service.url, beta) as stranger:
        with pytest.raises(NotFound):
            stranger.files.get(file.id)
        with pytest.raises(NotFound):
            stranger.files.download(file.id, tmp_path / "theirs.jsonl")
        with pytest.raises(NotFound) as refused:
            stranger.jobs.create(spec)
        assert refused.value.param == "dataset.file"
        assert list(stranger.files.list()) == []

    with Client(service.url, service.key) as client:
        client.files.delete(file.id)
        with pytest.raises(NotFound):
            client.files.get(file.id)


def test_the_openai_package_uploads_a_file_that_a_job_names(service, tmp_path):
    """`client.files.create` sends OpenAI's upload form over a real connection (uvicorn
    hands its body over in pieces); the file is stored whole and a job spec is admitted."""
    data = tmp_path / "train.jsonl"
    rows = [{"question": q, "answer": str(i)} for i, q in enumerate(QUESTIONS * 400)]
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))  # about 200 KB
    client = openai.OpenAI(base_url=f"{service.url}/v1", api_key=service.key, max_retries=0)
    with data.open("rb") as file:
        uploaded = client.files.create(file=file, purpose="fine-tune")
    assert (uploaded.object, uploaded.filename, uploaded.purpose) == (
        "file",
        "train.jsonl",
        "fine-tune",
    )
    assert uploaded.bytes == data.stat().st_size
    headers = {"Authorization": f"Bearer {service.key}"}
    content = httpx.get(f"{service.url}/v1/files/{uploaded.id}/content", headers=headers)
    assert content.content == data.read_bytes()
    spec = tiny_spec(steps=2) | {"dataset": {"source": "file", "file": uploaded.id}}
    assert service.submit(spec)["status"] == "queued"
