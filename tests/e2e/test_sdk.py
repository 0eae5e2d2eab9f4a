"""The Python SDK against the service as real processes: every resource through `Client`
and `AsyncClient`, pagination over several pages, each error family, and a submission
retried across an API process killed with SIGKILL that still makes exactly one job."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import re
import signal
import subprocess
import tarfile
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import httpx
import pandas
import pytest
import yaml

from app.core.config import get_settings
from app.jobs.schemas import JobPublic
from app.samples.schemas import SamplePublic
from app.sweeps.schemas import SweepCreate, SweepDetail, SweepPublic
from kernel.retry import Backoff
from kernel.spec import JobSpec
from opd import (
    AsyncClient,
    AuthenticationError,
    Client,
    Conflict,
    NotFound,
    PermissionDenied,
    RateLimited,
    ValidationError,
)
from opd.cli import main
from opd.sdk import AsyncJob, Job, Retries
from opd.sdk.client import local_key_path
from tests.e2e.conftest import Service, deployment, tiny_spec

KL = "opd/reverse_kl_mean"
LR = "train/learning_rate"
QUICK = Retries(attempts=6, backoff=Backoff(initial=0.2, cap=1.0))


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    home = tmp_path_factory.mktemp("sdk")
    with deployment(home, f"sqlite:///{home / 'opd.db'}") as running:
        yield running


@pytest.fixture
def client(service: Service) -> Iterator[Client]:
    with Client(service.url, service.key, retries=QUICK) as opd:
        yield opd


def admin_key(service: Service, team: str) -> str:
    return service.opd("keys", "create", "--team", team, "--admin").stdout.strip()


def a_worker(service: Service) -> None:
    if not any("worker" in p.args and p.poll() is None for p in service.processes):
        service.start_worker()


def test_a_job_and_everything_it_made_through_the_sdk(service, client, tmp_path, capsys):
    a_worker(service)
    spec = JobSpec.model_validate(tiny_spec(steps=6, save_every=3) | {"name": "sdk-tour"})
    job = client.jobs.create(spec)
    assert isinstance(job, Job) and isinstance(job, JobPublic) and job.status == "queued"

    done = job.wait(progress=True, interval=0.2, timeout=180)

    assert done.status == "succeeded", done.error
    shown = capsys.readouterr().err
    assert "6/6" in shown and "opd/reverse_kl_mean=" in shown
    frame = client.jobs.metrics(job.id, [KL, LR]).to_pandas()
    assert list(frame.index) == list(range(6)) and list(frame.columns) == [KL, LR]
    exported = pandas.read_csv(io.StringIO(client.jobs.export(job.id, keys=[KL, LR])))
    assert exported.set_index("step")[[KL, LR]].equals(frame.rename_axis("step"))
    jsonl = client.jobs.export(job.id, "jsonl", keys=[KL])
    assert len(jsonl.splitlines()) == 6 and '"step":5' in jsonl

    checkpoints = list(client.jobs.checkpoints(job.id, page_size=2))
    assert [(c.step, c.kind) for c in checkpoints] == [
        (3, "state"),
        (3, "sampler"),
        (6, "state"),
        (6, "final"),
    ]
    final = checkpoints[-1]
    download = client.jobs.download(job.id, final.id, tmp_path / "final.tar.gz")
    assert download.sha256 == hashlib.sha256(download.path.read_bytes()).hexdigest()
    with tarfile.open(download.path) as archive:
        assert any(name.endswith("adapter_model.safetensors") for name in archive.getnames())

    samples = list(client.jobs.samples(job.id, page_size=1))
    assert len(samples) > 1 and all(isinstance(s, SamplePublic) for s in samples)
    assert all(len(s.tokens) == len(s.reverse_kl) for s in samples)
    assert "Succeeded" in " | ".join(event.message for event in client.jobs.events(job.id))

    answer = client.jobs.playground(
        job.id, "What is 2 + 3?", compare=["teacher"], max_tokens=8, seed=7, stop=["\n\n"]
    )
    assert [output.model for output in answer.outputs] == ["checkpoint", "teacher"]
    assert answer.checkpoint.id == final.id
    by_teacher = client.jobs.playground(job.id, "What is 2 + 3?", model="teacher", max_tokens=4)
    assert [output.model for output in by_teacher.outputs] == ["teacher"]
    with pytest.warns(DeprecationWarning, match="use jobs.playground"):
        old = client.jobs.sample(job.id, "What is 2 + 3?", max_tokens=4)
    assert [output.model for output in old.outputs] == ["checkpoint"]

    clone = client.jobs.clone(job.id, {"loop": {"steps": 2}, "name": "sdk-clone"})
    assert clone.spec.loop.steps == 2 and clone.id != job.id
    assert client.jobs.cancel(clone.id).status in ("cancelled", "cancelling")
    compared = client.jobs.compare([clone.id, job.id], KL)
    assert [curves.job_id for curves in compared.jobs] == [clone.id, job.id]
    table = compared.to_pandas()
    assert table[(job.id, KL)].dropna().equals(frame[KL])
    assert list(table.columns.names) == ["job_id", "metric"]
    assert [j.id for j in client.jobs.list(name="SDK-TOUR")] == [job.id]
    assert [j.id for j in client.jobs.list(metadata={"no-such": "label"})] == []

    usage = client.usage.get(group_by="job")
    [line] = [line for line in usage.rows if line.job_id == job.id]
    assert line.sampled_tokens > 0 and line.trained_tokens > 0
    with pytest.warns(DeprecationWarning, match=r"use usage.get\(since=\)"):
        old_usage = client.usage.get(first=usage.since, group_by="job")
    assert old_usage.rows == usage.rows
    actions = [entry.action for entry in client.audit.list(page_size=2)]
    assert actions[:3] == ["job.cancel", "job.create", "job.create"]

    hook = client.webhooks.create("https://example.com/opd", ["job.succeeded"], description="x")
    assert hook.secret.startswith("whsec_")
    assert [h.id for h in client.webhooks.list()] == [hook.id]
    assert client.webhooks.get(hook.id).url == "https://example.com/opd"
    assert list(client.webhooks.deliveries(hook.id)) == []
    client.webhooks.delete(hook.id)
    with pytest.raises(NotFound):
        client.webhooks.get(hook.id)

    async def from_asyncio() -> tuple[AsyncJob, list[int], list[int], str]:
        async with AsyncClient(service.url, service.key) as opd:
            again = await (await opd.jobs.get(job.id)).wait()
            steps = (await opd.jobs.metrics(job.id, KL)).curves[KL].steps
            ids = [checkpoint.id async for checkpoint in opd.jobs.checkpoints(job.id)]
            saved = await opd.jobs.download(job.id, final.id, tmp_path / "again.tar.gz")
            return again, steps, ids, saved.sha256

    again, steps, ids, sha256 = asyncio.run(from_asyncio())
    assert isinstance(again, AsyncJob) and again.status == "succeeded"
    assert steps == list(range(6)) and ids == [c.id for c in checkpoints]
    assert sha256 == download.sha256


def test_the_cli_drives_the_api_through_the_sdk(service, tmp_path, capsys):
    a_worker(service)
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(tiny_spec(steps=3) | {"name": "by-cli"}))
    key = service.opd("keys", "create", "--team", "cli-tour").stdout.strip()

    def opd(*args: str, as_key: str = key) -> tuple[int, str, str]:
        code = main([*args, "--url", service.url, "--key", as_key])
        out, err = capsys.readouterr()
        return code, out, err

    assert opd("jobs") == (0, "no jobs\n", "")
    code, first, _ = opd("jobs", "create", str(spec), "--idempotency-key", "cli-1", "--quiet")
    job = first.strip()
    code, again, _ = opd("jobs", "create", str(spec), "--idempotency-key", "cli-1")
    assert code == 0 and again.startswith(f"Job {job} already exists (")
    assert "'cli-1' made it before; nothing new was submitted" in again
    code, old, err = opd("submit", str(spec), "--idempotency-key", "cli-1", "--quiet")
    assert (code, old) == (0, first)
    assert (
        err == "note: opd submit is deprecated and goes in the next release; use opd jobs create\n"
    )
    code, out, err = opd("watch", job)
    assert code == 0 and re.search(rf"^ *{job}  succeeded +3/3 +\S+ \S+ +- +by-cli$", out, re.M), (
        out
    )
    assert "opd/reverse_kl_mean=" in err
    code, out, _ = opd("status", job)
    assert code == 0 and "reverse KL" in out
    assert f"weights: `opd export {job} job-{job}-final` downloads them" in out
    assert "final_weights_path" not in out, "a server's path means nothing to a remote user"
    code, _, err = opd("resume", job)
    assert code == 1 and f"`opd clone {job}`" in err
    code, _, err = opd("sweep", "create", str(spec))
    assert code == 1 and "this is a job spec, not a sweep: a sweep needs `base:`" in err
    header, row = opd("jobs", "--limit", "1")[1].splitlines()
    assert header.split() == ["id", "status", "steps", "created", "(UTC)", "last", "eval", "name"]
    assert row.split()[:2] == [job, "succeeded"]
    assert opd("jobs", "list", "--name", "BY-CLI")[1].splitlines()[1].split()[0] == job
    assert opd("jobs", "list", "--name", "nothing-like-it")[1] == "no jobs match these filters\n"
    admin = admin_key(service, "cli-admins")
    header, *rows = opd("jobs", "--limit", "50", as_key=admin)[1].splitlines()
    assert header.split()[:2] == ["team", "id"]
    assert [r.split()[:2] for r in rows if r.split()[1] == job] == [["cli-tour", job]]
    code, out, _ = opd("samples", job, "--limit", "2")
    assert code == 0 and out.count("highest reverse KL:") == 2
    worst = [line for line in out.splitlines() if line.startswith("highest reverse KL:")]
    assert not any(" -0.000" in line or " 0.000" in line for line in worst), worst
    code, out, _ = opd("events", job)
    assert code == 0 and out.splitlines()[0].split() == ["time", "level", "message"]
    assert "Succeeded" in out
    code, out, err = opd("checkpoints", job)
    assert code == 0 and [line.split()[1:3] for line in out.splitlines()[1:]][-1] == ["3", "final"]
    assert f"opd export {job} OUT_DIR" in err
    code, out, _ = opd("metrics", job, "--keys", KL)
    assert code == 0 and out.splitlines()[0] == f"step,{KL}" and len(out.splitlines()) == 4
    code, _, _ = opd("metrics", job, "--format", "jsonl", "-o", str(tmp_path / "m.jsonl"))
    assert code == 0 and len((tmp_path / "m.jsonl").read_text().splitlines()) == 3
    chat = '[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2 + 3?"}]'
    code, out, _ = opd("playground", job, "--messages", chat, "--max-tokens", "4", "--seed", "1")
    assert code == 0 and out.startswith(f"job {job}: final weights after step 3;")
    code, out, err = opd("sample", job, "2 + 3?", "--max-tokens", "4", "--compare", "teacher")
    assert code == 0 and "--- teacher" in out and "use opd playground" in err
    code, _, err = opd("playground", job)
    assert code == 1 and err == "error: give a PROMPT or --messages (one of them)\n"
    code, _, err = opd("pause", job)
    assert code == 1 and err.startswith("error: HTTP 409: ") and "succeeded" in err
    code, out, _ = opd("audit", "--limit", "1")
    assert code == 0 and out.splitlines()[0].split()[:4] == ["time", "key", "team", "action"]
    assert out.splitlines()[1].split()[2:6] == ["cli-tour", "job.create", "job", job]  # newest
    code, _, err = opd("audit", "--action", "nonsense")
    assert code == 1 and "no audit action 'nonsense'; the actions are job.create, " in err
    code, out, _ = opd("usage", "--group-by", "day", "--since", "2020-01-01")
    assert code == 0 and out.splitlines()[-1].startswith("total")
    code, old, err = opd("usage", "--by", "day", "--since", "2020-01-01")
    assert (code, old) == (0, out) and "use --group-by" in err
    code, _, err = opd("status", "999999")
    assert code == 1 and err == "error: HTTP 404: job 999999 not found\n"
    assert main(["jobs", "--url", service.url, "--key", "not-a-key"]) == 1
    refused = capsys.readouterr().err
    local = local_key_path(get_settings().home)
    assert refused.startswith("error: HTTP 401: unknown or revoked API key\n")
    assert "the key given with --key was refused" in refused
    assert "`export OPD_API_KEY=KEY`" in refused and f"opd reads {local}" in refused


def test_sweeps_through_the_sdk_and_the_cli(service, tmp_path, capsys):
    key = service.opd("keys", "create", "--team", "sweeps").stdout.strip()
    stranger = service.opd("keys", "create", "--team", "sweeps-elsewhere").stdout.strip()
    definition = {
        "name": "sdk-sweep",
        "base": tiny_spec(steps=2000),
        "parameters": {"optim.learning_rate": {"values": [1.0e-4, 1.0e-3]}},
        "method": "grid",
        "metric": {"name": KL, "goal": "minimize"},
        "max_trials": 2,
    }
    counted = Counting()
    with Client(service.url, key, retries=QUICK, transport=counted) as client:
        first = client.sweeps.create(definition)
        second = client.sweeps.create(SweepCreate.model_validate(definition | {"name": "sdk-2"}))
        assert isinstance(first, SweepDetail) and first.status == "running"
        assert (first.trials_planned, second.name, second.max_trials) == (2, "sdk-2", 2)
        counted.sent.clear()

        listed = list(client.sweeps.list(page_size=1))

        assert [sweep.id for sweep in listed] == [second.id, first.id]
        assert all(type(sweep) is SweepPublic for sweep in listed)
        pages = [url for url in counted.sent if url.path == "/v1/sweeps"]
        assert [url.params.get("after") for url in pages] == [None, str(second.id)]
        cancelled = client.sweeps.cancel(first.id)
        assert cancelled.status == "cancelled" and cancelled.finished_at is not None
        assert client.sweeps.get(first.id).status == "cancelled"
    with Client(service.url, stranger, retries=QUICK) as elsewhere, pytest.raises(NotFound):
        elsewhere.sweeps.get(second.id)

    async def by_asyncio() -> tuple[list[int], SweepDetail]:
        async with AsyncClient(service.url, key) as opd:
            return [s.id async for s in opd.sweeps.list()], await opd.sweeps.get(second.id)

    ids, again = asyncio.run(by_asyncio())
    assert ids == [second.id, first.id] and again.name == "sdk-2"

    def opd(*args: str) -> tuple[int, str]:
        code = main([*args, "--url", service.url, "--key", key])
        return code, capsys.readouterr().out

    file = tmp_path / "sweep.yaml"
    file.write_text(yaml.safe_dump(definition | {"name": "by-cli"}))
    code, made = opd("sweep", "create", str(file), "--quiet")  # the old name still works
    assert code == 0 and int(made) > second.id
    code, out = opd("sweeps", "list", "--limit", "2")
    assert code == 0 and [line.split()[:2] for line in out.splitlines()[1:]] == [
        [made.strip(), "running"],
        [str(second.id), "running"],
    ]
    code, out = opd("sweeps", "cancel", str(second.id))
    assert code == 0 and out.splitlines()[1].split()[:2] == [str(second.id), "cancelled"]
    code, out = opd("sweeps", "status", made.strip())
    assert code == 0 and "optim.learning_rate" in out.splitlines()[2]
    assert out.splitlines()[-1].startswith("steps early stopping saved: ")
    assert opd("sweeps", "cancel", made.strip())[0] == 0


def test_keys_and_teams_with_an_admin_key(service):
    with Client(service.url, admin_key(service, "ops")) as admin:
        made = admin.keys.create("sdk-team", scope="read", expires_in_days=1)
        assert made.key and made.team == "sdk-team" and made.scope == "read"
        assert made.prefix in [key.prefix for key in admin.keys.list()]
        admin.keys.revoke(made.prefix)
        [listed] = [key for key in admin.keys.list() if key.prefix == made.prefix]
        assert listed.revoked_at is not None

        team = admin.teams.update("sdk-team", max_running=3)
        assert team.max_running == 3 and team.effective_max_running == 3
        assert admin.teams.update("sdk-team", max_running=None).max_running is None
        assert "sdk-team" in [team.name for team in admin.teams.list()]


class Counting(httpx.HTTPTransport):
    """Counts the requests a client sends."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[httpx.URL] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.sent.append(request.url)
        return super().handle_request(request)


def test_lists_follow_the_cursor_over_several_pages(service, tmp_path):
    key = service.opd("keys", "create", "--team", "pages").stdout.strip()
    counted = Counting()
    with Client(service.url, key, transport=counted) as client:
        made = [client.jobs.create(tiny_spec(steps=2000)).id for _ in range(5)]
        counted.sent.clear()

        listed = [job.id for job in client.jobs.list(page_size=2)]

        assert listed == made[::-1]  # newest first, each once
        pages = [url for url in counted.sent if url.path == "/v1/jobs"]
        assert len(pages) == 3
        assert [url.params.get("after") for url in pages] == [None, str(made[3]), str(made[1])]
        assert list(client.jobs.list(status="paused")) == []  # the filter is sent
        for job_id in made:
            client.jobs.cancel(job_id)

    async def listed_by_asyncio() -> list[int]:
        async with AsyncClient(service.url, key) as opd:
            return [job.id async for job in opd.jobs.list(page_size=2)]

    assert asyncio.run(listed_by_asyncio()) == made[::-1]


def test_each_error_family_from_the_server(service):
    read_key = service.opd("keys", "create", "--team", "errors", "--scope", "read").stdout
    submit_key = service.opd("keys", "create", "--team", "errors").stdout.strip()
    # One runs at most, one waits at most: a third is over the limit, whether or not a
    # worker took the first before the second came.
    service.opd("teams", "set", "errors", "--max-running", "1", "--max-queued", "1")
    once = Retries(attempts=0)
    with (
        Client(service.url, "opd_not-a-key", retries=once) as stranger,
        Client(service.url, read_key.strip(), retries=once) as reader,
        Client(service.url, submit_key, retries=once) as client,
    ):
        with pytest.raises(AuthenticationError) as unknown:
            stranger.jobs.get(1)
        with pytest.raises(PermissionDenied) as read_only:
            reader.jobs.create(tiny_spec())
        with pytest.raises(ValidationError) as invalid:
            client.jobs.create(tiny_spec(steps=0))
        job = client.jobs.create(tiny_spec(steps=2000))
        waiting = []
        with pytest.raises(RateLimited) as limited:
            for _ in range(2):
                waiting.append(client.jobs.create(tiny_spec(steps=2000)))
        with pytest.raises(NotFound) as missing:
            client.jobs.get(job.id + 1000)
        for each in (job, *waiting):
            client.jobs.cancel(each.id)
        with pytest.raises(Conflict) as conflict:
            client.jobs.pause(job.id)

    assert (unknown.value.status, unknown.value.code) == (401, "unauthorized")
    assert (read_only.value.status, read_only.value.code) == (403, "forbidden")
    assert "'submit' scope" in read_only.value.message
    assert invalid.value.status == 422 and invalid.value.param == "loop.steps"
    assert (limited.value.status, limited.value.retry_after) == (429, 60)
    assert (missing.value.status, missing.value.code) == (404, "not_found")
    assert conflict.value.status == 409 and "cancelled" in conflict.value.message


class Relay(ThreadingHTTPServer):
    """Forwards requests to the API. The first POST instead goes to `fault`, which may
    forward it and kill the API, and is left unanswered: the connection just closes."""

    daemon_threads = True

    def __init__(self, upstream: str, fault: Callable[[Callable[[], httpx.Response]], None]):
        super().__init__(("127.0.0.1", 0), RelayHandler)
        self.upstream = upstream
        self.fault: Callable[[Callable[[], httpx.Response]], None] | None = fault

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class RelayHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Relay
    HOP: ClassVar = {"host", "content-length", "connection", "transfer-encoding", "date", "server"}

    def relay(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        headers = {k: v for k, v in self.headers.items() if k.lower() not in self.HOP}

        def forward() -> httpx.Response:
            url = self.server.upstream + self.path
            return httpx.request(self.command, url, content=body, headers=headers, timeout=30)

        if self.command == "POST" and self.server.fault is not None:
            fault, self.server.fault = self.server.fault, None
            fault(forward)
            self.close_connection = True
            return
        answer = forward()
        self.send_response(answer.status_code)
        for name, value in answer.headers.items():
            if name.lower() not in self.HOP | {"content-encoding"}:
                self.send_header(name, value)
        self.send_header("Content-Length", str(len(answer.content)))
        self.end_headers()
        self.wfile.write(answer.content)

    do_GET = do_POST = relay

    def log_message(self, *args: Any) -> None:
        pass


def api_process(service: Service) -> subprocess.Popen:
    [api] = [p for p in service.processes if "api" in p.args and p.poll() is None]
    return api


def kill_and_restart(service: Service) -> None:
    api = api_process(service)
    api.send_signal(signal.SIGKILL)
    api.wait(30)
    service.start_api()


@pytest.mark.parametrize("moment", ["after the job is stored", "while the request runs"])
def test_a_retried_submission_across_a_killed_api_makes_one_job(service, moment):
    key = service.opd("keys", "create", "--team", f"retry-{moment[:5]}").stdout.strip()
    stored: list[int] = []

    def after_stored(forward: Callable[[], httpx.Response]) -> None:
        answer = forward()
        assert answer.status_code == 201, answer.text
        stored.append(answer.json()["id"])
        kill_and_restart(service)

    def while_running(forward: Callable[[], httpx.Response]) -> None:
        def send() -> None:
            with contextlib.suppress(httpx.HTTPError):  # the API dies before it answers
                forward()

        sending = threading.Thread(target=send)
        sending.start()
        time.sleep(0.05)  # the API has the request (it may or may not have stored the job)
        kill_and_restart(service)
        sending.join(30)

    first_api = api_process(service).pid
    fault = after_stored if moment == "after the job is stored" else while_running
    relay = Relay(service.url, fault)
    threading.Thread(target=relay.serve_forever, daemon=True).start()
    try:
        with Client(relay.url, key, retries=QUICK) as client:
            job = client.jobs.create(tiny_spec(steps=2000))
            jobs = [listed.id for listed in client.jobs.list()]
            client.jobs.cancel(job.id)
    finally:
        relay.shutdown()
        relay.server_close()

    assert api_process(service).pid != first_api, "the API was killed and restarted"
    assert jobs == [job.id], "one job, whatever the API had done when it died"
    if stored:
        assert stored == [job.id], "the retry returned the job the first attempt stored"
