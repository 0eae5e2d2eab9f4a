"""Issue 29's proof: nothing shared but Postgres, Redis and a bucket (moto's S3 server). An
`opd api` and two `opd worker`s, each with its own OPD_HOME (so its own data, artifact and
cache folders). A team uploads its data, trains with save_every, loses a worker to kill
-9 mid-job, and the other worker resumes from the checkpoint in the bucket with the
uninterrupted run's curve; the team downloads the final weights (and exports them merged
into a Hugging Face model), samples them in the playground and continues from them;
another team reaches neither the file nor the weights."""

from __future__ import annotations

import hashlib
import io
import json
import signal
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.core.config import Settings
from app.core.storage import checkpoint_store
from opd import Client, NotFound
from tests.e2e.conftest import Service, deployment, tiny_spec
from tests.e2e.servers import Relay
from tests.e2e.test_faults import COMPARED, at_step, foreground_run, metric_rows
from tests.support import S3_ENDPOINT, temporary_bucket, temporary_postgres_database

QUESTIONS = [f"What is {a} + {b}?" for a in range(4) for b in range(3)]
STEPS, SAVE_EVERY = 12, 4


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    (tmp_path / "api").mkdir()
    with (
        temporary_bucket() as bucket,
        temporary_postgres_database() as database,
        deployment(tmp_path / "api", database, storage_url=bucket) as running,
    ):
        yield running


def test_a_job_moves_between_workers_that_share_no_disk(service, tmp_path):
    data = tmp_path / "alpha.jsonl"
    data.write_text("".join(json.dumps({"question": q}) + "\n" for q in QUESTIONS))
    with Client(service.url, service.key) as alpha:
        file = alpha.files.upload(data, progress=False)
    spec = tiny_spec(steps=STEPS, save_every=SAVE_EVERY) | {
        "dataset": {"source": "file", "file": file.id, "question_suffix": ""}
    }

    homes = [tmp_path / "worker-a", tmp_path / "worker-b"]
    first = service.start_worker(OPD_HOME=str(homes[0]))
    job = service.submit(spec)
    service.wait(job["id"], at_step(SAVE_EVERY * 2 + 1))
    service.start_worker(OPD_HOME=str(homes[1]))
    first.send_signal(signal.SIGKILL)
    first.wait()
    done = service.wait(job["id"], timeout=300)
    assert done["status"] == "succeeded" and done["attempts"] == 2, service.logs()
    assert done["final_weights_path"].startswith("opd-store://")
    resumed_from = [
        e.data["path"] for e in service.events(job["id"]) if e.message.startswith("Resumed")
    ]
    assert len(resumed_from) == 1 and resumed_from[0].startswith("opd-store://")

    # The second worker read that state from the bucket: the first one's disk has it.
    name = resumed_from[0].rsplit("/", 1)[1]
    states = [home / "artifacts" / f"job-{job['id']}" / "state" / name for home in homes]
    assert states[0].is_dir() and not states[1].exists()
    assert [p.name for p in (homes[1] / "cache" / "checkpoints").iterdir()] == [
        resumed_from[0].split("/")[2]
    ]

    again = service.submit(spec | {"name": "uninterrupted"})
    assert service.wait(again["id"], timeout=300)["status"] == "succeeded"
    resumed, whole = metric_rows(service, job["id"]), metric_rows(service, again["id"])
    assert [step for step, _ in resumed] == list(range(STEPS))
    for (step, metrics), (_, expected) in zip(resumed, whole, strict=True):
        for key in COMPARED:
            assert metrics[key] == expected[key], (step, key)

    with Client(service.url, service.key) as alpha:
        final = next(iter(alpha.jobs.checkpoints(job["id"], kind="final")))
        download = alpha.jobs.download(job["id"], final.id, tmp_path / "final.tar.gz")
        archive = (tmp_path / "final.tar.gz").read_bytes()
        assert download.sha256 == hashlib.sha256(archive).hexdigest()
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            names = {Path(member.name).name for member in tar if member.isfile()}
        assert {"adapter_model.safetensors", "manifest.json"} <= names

        exported = tmp_path / "exported"
        merge = ("export", str(job["id"]), str(exported), "--merge")
        service.opd(*merge, "--url", service.url, "--key", service.key)
        assert (exported / "config.json").is_file() and (exported / "model.safetensors").is_file()

        answer = alpha.jobs.sample(job["id"], "What is 2 + 3?", max_tokens=8)
        assert answer.checkpoint.path == done["final_weights_path"]
        assert answer.outputs[0].completions[0].tokens

        continued = service.submit(
            tiny_spec(steps=2)
            | {"dataset": spec["dataset"], "name": "continued"}
            | {
                "student": spec["student"]
                | {"init_from": {"job": job["id"], "checkpoint": "final"}}
            }
        )
        assert service.wait(continued["id"])["status"] == "succeeded", service.logs()
        started = [
            e.data["path"]
            for e in service.events(continued["id"])
            if e.message.startswith("Started from the weights of")
        ]
        assert len(started) == 1 and started[0].startswith("opd-store://")

    beta = service.opd("keys", "create", "--team", "beta").stdout.strip()
    with Client(service.url, beta) as stranger:
        with pytest.raises(NotFound):
            stranger.files.get(file.id)
        with pytest.raises(NotFound):
            stranger.jobs.download(job["id"], final.id, tmp_path / "stolen.tar.gz")
        assert not (tmp_path / "stolen.tar.gz").exists()


def test_a_store_outage_mid_job_requeues_it_and_loses_no_step(tmp_path, tmp_path_factory):
    """The worker reaches the bucket through a relay that is cut after the first checkpoint:
    the next upload fails once its retries are spent, the job is requeued (and again while
    the store stays away), and once the store is back it resumes from the last recorded
    checkpoint, every step as the uninterrupted run's, every recorded checkpoint whole."""
    spec = tiny_spec(steps=STEPS, save_every=SAVE_EVERY)
    expected = foreground_run(tmp_path_factory, spec)
    relay = Relay(int(S3_ENDPOINT.rsplit(":", 1)[1]))
    relay.start()
    (tmp_path / "api").mkdir()
    with (
        temporary_bucket() as bucket,
        deployment(
            tmp_path / "api", f"sqlite:///{tmp_path / 'opd.db'}", storage_url=bucket
        ) as service,
    ):
        service.start_worker(
            OPD_HOME=str(tmp_path / "worker"),
            AWS_ENDPOINT_URL=relay.url,
            OPD_STORAGE_RETRY_SECONDS="1",
            OPD_MAX_ATTEMPTS="30",
        )
        job = service.submit(spec)
        service.wait(job["id"], at_step(SAVE_EVERY + 1))
        relay.cut()
        service.wait(job["id"], lambda j: j["attempts"] >= 2)
        relay.start()
        done = service.wait(job["id"], timeout=300)
        assert done["status"] == "succeeded", service.logs()

        rows = metric_rows(service, job["id"])
        assert [step for step, _ in rows] == list(range(STEPS))
        for step, metrics in rows:
            for key in COMPARED:
                assert metrics[key] == expected[step][key], (step, key)
        timeline = [e.message for e in service.events(job["id"])]
        assert any("object store did not complete" in m for m in timeline if "Requeued" in m)
        with Client(service.url, service.key) as alpha:
            saved = list(alpha.jobs.checkpoints(job["id"]))
        store = checkpoint_store(Settings(home=tmp_path / "reader", storage_url=bucket))
        assert store is not None and saved
        for checkpoint in saved:  # each recorded one is whole: its manifest's every object
            assert store.local(checkpoint.path)
    relay.cut()
