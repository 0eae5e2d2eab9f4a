"""Using what a job produced, against real `opd api` and `opd worker` processes on the tiny
models: the playground (its cache, its deadline, a worker restart, its usage, an answer lost
on the way and resent), `opd playground`, the dashboard's playground form, continuing a job with
`opd clone --init-from`, and `opd export` (the merged model loads without peft and scores
as the adapter does). One deployment."""

from __future__ import annotations

import asyncio
import re
import signal
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from pytrio.types import ModelInput

from app.playground.schemas import PlaygroundAnswer
from kernel.retry import Backoff
from kernel.spec import JobSpec
from opd.cli import main
from opd.sdk import Client, Retries
from tests.e2e.conftest import Service, deployment, tiny_spec
from tests.e2e.servers import Relay
from tests.support import assert_close, score_without_peft
from worker.engine.backends import connect

PROMPT = "What is 2 + 3?"
SCORED = "<|im_start|>user\nCompute 7 * 8.<|im_end|>\n<|im_start|>assistant\nIt is 56."


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    home = tmp_path_factory.mktemp("playground")
    with deployment(home, f"sqlite:///{home / 'opd.db'}") as running:
        running.start_worker()
        yield running


@pytest.fixture(scope="module")
def trained(service: Service) -> dict[str, Any]:
    """A tiny job run to its end; it saved sampler weights and a state after step 5."""
    job = service.submit(tiny_spec(steps=10, save_every=5) | {"name": "trained"})
    done = service.wait(job["id"])
    assert done["status"] == "succeeded", done
    return done


def sample(service: Service, job_id: int, **body: Any) -> httpx.Response:
    return httpx.post(
        f"{service.url}/v1/jobs/{job_id}/playground",
        json={"prompt": PROMPT, "max_tokens": 16} | body,
        headers={"Authorization": f"Bearer {service.key}"},
        timeout=120,
    )


@dataclass
class Ran:
    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def cli(service: Service, capsys: pytest.CaptureFixture[str]) -> Callable[..., Ran]:
    """`opd ARGS` against the deployment (in this process: no interpreter to start)."""

    def run(*args: str) -> Ran:
        code = main([*args, "--url", service.url, "--key", service.key])
        out, err = capsys.readouterr()
        return Ran(code, out, err)

    return run


def test_a_worker_samples_the_checkpoint_beside_the_teacher_and_the_base(service, trained):
    first = sample(service, trained["id"], n=2, compare=["teacher", "base"])
    again = sample(service, trained["id"], compare=["teacher"])
    step = sample(service, trained["id"], checkpoint=5)

    assert first.status_code == 200, first.text
    answer = first.json()
    assert answer["checkpoint"]["kind"] == "final"
    assert answer["checkpoint"]["path"] == trained["final_weights_path"]
    assert [o["model"] for o in answer["outputs"]] == ["checkpoint", "teacher", "base"]
    for output in answer["outputs"]:
        assert len(output["completions"]) == 2
        for completion in output["completions"]:
            assert len(completion["tokens"]) == len(completion["logprobs"]) > 0
            if output["model"] != "teacher":
                assert len(completion["reverse_kl"]) == len(completion["tokens"])
    assert [o["cached"] for o in again.json()["outputs"]] == [True, True]
    assert step.status_code == 200 and step.json()["checkpoint"]["step"] == 5
    assert step.json()["outputs"][0]["weights"] != trained["final_weights_path"]


def test_opd_playground_prints_each_models_completions(cli, trained):
    shown = cli("playground", str(trained["id"]), PROMPT, "--compare", "teacher", "-n", "2")

    assert shown.returncode == 0, shown.stderr
    assert f"job {trained['id']}: final weights after step 10" in shown.stdout
    model = r"--- {} \({}, (cached|loaded)\)"  # whether an earlier test loaded them
    assert re.search(
        model.format("checkpoint", "tiny-student") + r": reverse KL mean -?\d", shown.stdout
    )
    assert re.search(model.format("teacher", "tiny-teacher"), shown.stdout)
    assert "[2] (" in shown.stdout and "highest reverse KL:" in shown.stdout


def usage_row(service: Service, job_id: int) -> dict[str, int]:
    """The job's sampled and teacher tokens, as `GET /v1/usage` adds up its rows."""
    with service.client() as client:
        (row,) = [row for row in client.usage.get().rows if row.job_id == job_id]
    return {"sampled_tokens": row.sampled_tokens, "teacher_tokens": row.teacher_tokens}


def added(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {column: after[column] - before[column] for column in after}


def tokens_of(answer: dict[str, Any]) -> dict[str, int]:
    """What an answer's models sampled and its teacher read, as training counts them: the
    checkpoint's (and base's) completion tokens; the teacher's prompt and completions when
    it completed the prompt too, and the prompt and tokens of each completion it scored."""
    tokens = {"sampled_tokens": 0, "teacher_tokens": 0}
    prompt = answer["prompt_tokens"]
    for output in answer["outputs"]:
        lengths = [len(completion["token_ids"]) for completion in output["completions"]]
        if output["model"] == "teacher":
            tokens["teacher_tokens"] += prompt + sum(lengths)
            continue
        tokens["sampled_tokens"] += sum(lengths)
        scored = [c for c in output["completions"] if c["teacher_logprobs"] is not None]
        tokens["teacher_tokens"] += sum(prompt + len(c["token_ids"]) for c in scored)
    return tokens


def test_try_it_on_the_job_page_bills_as_the_api_does(service, trained):
    """Greedy, so the panel samples what the API's request sampled: each adds its tokens
    to the job's usage rows."""
    before = usage_row(service, trained["id"])
    greedy = {"checkpoint": 5, "max_tokens": 8, "temperature": 0, "compare": ["teacher"]}
    answer = sample(service, trained["id"], **greedy).json()
    between = usage_row(service, trained["id"])
    with httpx.Client(base_url=service.url, timeout=120) as browser:
        sign_in = browser.get("/ui/sign-in")
        token = re.search(r'name="csrf_token" value="([^"]+)"', sign_in.text).group(1)
        browser.post("/ui/sign-in", data={"csrf_token": token, "key": service.key})
        page = browser.get(f"/ui/jobs/{trained['id']}")
        assert 'id="try-form"' in page.text and "/ui/static/try_it.js" in page.text
        token = re.search(r'name="csrf_token" value="([^"]+)"', page.text).group(1)
        form = {"csrf_token": token, "prompt": PROMPT, "checkpoint": "5", "compare_teacher": "1"}
        form |= {"max_tokens": "8", "temperature": "0"}
        fragment = browser.post(f"/ui/jobs/{trained['id']}/try", data=form)

    assert fragment.status_code == 200, fragment.text
    assert "sampler weights after step 5" in fragment.text
    assert fragment.text.count('class="rollout try-output"') == 2
    assert re.search(r'class="tok kl-\d" title="logprob [^"]+ · reverse KL', fragment.text)
    billed = added(between, before)
    assert billed == tokens_of(answer) and billed["sampled_tokens"] > 0
    assert added(usage_row(service, trained["id"]), between) == billed


def test_a_sample_whose_answer_was_lost_is_resent_sampled_and_billed_once(service, trained):
    """The SDK's read timeout, for real: a relay loses the API's first answer, the SDK
    sends the request again with its Idempotency-Key, and the API answers it with the
    answer it kept (the worker samples once, the job is billed once)."""
    relay = Relay(int(service.url.rsplit(":", 1)[1]), withhold_first=True)
    relay.start()
    before = usage_row(service, trained["id"])
    retries = Retries(attempts=2, backoff=Backoff(initial=0.01, cap=0.05))
    try:
        with Client(relay.url, service.key, timeout=1, retries=retries) as client:
            answer = client.jobs.sample(
                trained["id"], PROMPT, max_tokens=8, compare=["teacher"], timeout_seconds=5
            )
    finally:
        relay.stop()

    assert len(relay.answers) == 2
    (lost_headers, lost), (resent_headers, resent) = map(http_answer, relay.answers)
    assert PlaygroundAnswer.model_validate_json(lost) == answer  # what the worker sampled
    assert resent == lost and resent_headers.get("idempotent-replayed") == "true"
    assert "idempotent-replayed" not in lost_headers
    assert added(usage_row(service, trained["id"]), before) == tokens_of(
        answer.model_dump(mode="json")
    )


def http_answer(raw: bytes) -> tuple[dict[str, str], bytes]:
    """An HTTP/1.1 answer's headers (names in lower case) and body, as a relay saw them."""
    head, body = bytes(raw).split(b"\r\n\r\n", 1)
    lines = head.decode().split("\r\n")[1:]
    return {
        name.lower(): value.strip() for name, value in (line.split(":", 1) for line in lines)
    }, body


def test_past_its_deadline_a_request_is_a_504_and_a_restarted_worker_answers(service, trained):
    [worker] = [p for p in service.processes if "worker" in str(p.args) and p.poll() is None]
    worker.send_signal(signal.SIGKILL)
    worker.wait(30)

    late = sample(service, trained["id"], timeout_seconds=1)
    assert late.status_code == 504, late.text
    assert "no worker answered within 1 s" in late.json()["error"]["message"]

    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(sample, service, trained["id"], timeout_seconds=90)
        service.start_worker()  # the request waits in Redis for the new worker
        answered = waiting.result(timeout=120)
    assert answered.status_code == 200, answered.text
    assert [o["cached"] for o in answered.json()["outputs"]] == [False]  # a fresh process


def test_opd_clone_continues_the_job_from_its_final_state(cli, service, trained):
    cloned = cli("clone", str(trained["id"]), "--init-from", "final", "--set", "loop.steps=3")
    assert cloned.returncode == 0, cloned.stderr
    clone = service.wait(int(re.search(r"as job (\d+)", cloned.stdout).group(1)))

    assert clone["status"] == "succeeded", clone
    init_from = clone["spec"]["student"]["init_from"]
    assert init_from["job"] == trained["id"] and init_from["path"].endswith("-state-000010")
    events = service.events(clone["id"])
    started = [e.data for e in events if e.message.startswith("Started from the weights of")]
    assert started == [{"path": init_from["path"]}]  # a team's key: named from the job's folder
    source_kl = service.curve(trained["id"], "opd/reverse_kl_mean")
    clone_kl = service.curve(clone["id"], "opd/reverse_kl_mean")
    assert clone_kl[0][1] < source_kl[0][1]  # it starts where the source ended, not afresh


def test_opd_export_merges_a_model_that_loads_without_peft(service, cli, trained, tmp_path):
    merged, adapter = tmp_path / "merged", tmp_path / "adapter"
    api = ("--url", service.url, "--key", service.key)
    exported = service.opd("export", str(trained["id"]), str(merged), "--merge", *api)
    plain = cli("export", str(trained["id"]), str(adapter), "--checkpoint", "5")

    assert "Its logprobs match the adapter model's" in exported.stdout
    assert exported.stderr == "", "no library warnings or progress bars"
    modes = {path.name: path.stat().st_mode & 0o777 for path in merged.iterdir()}
    assert len(set(modes.values())) == 1, modes  # the weights as their siblings
    assert plain.returncode == 0, plain.stderr
    assert {"adapter_model.safetensors", "manifest.json"} <= {p.name for p in adapter.iterdir()}
    card = (adapter / "README.md").read_text()  # PEFT's was a blank template
    assert card.startswith("---\nbase_model: tiny-student\nlibrary_name: peft\n---")
    assert f"job {trained['id']}'s sampler weights after step 5" in card
    assert "trained by on-policy distillation" in card and "## Prompt format" in card
    assert "reverse KL (training prompts):" in (merged / "README.md").read_text()
    saved = datetime.fromisoformat(trained["finished_at"]).timestamp()
    for path in [adapter, *adapter.iterdir()]:
        assert abs(path.stat().st_mtime - saved) < 3600, (path, path.stat().st_mtime)
    ids, scores = score_without_peft(merged, SCORED)
    final = service.home / "artifacts" / trained["final_weights_path"]  # named for a team
    expected = asyncio.run(adapter_scores(trained, str(final), ids, tmp_path))
    assert_close(scores, expected, what="the merged model (no peft) vs the adapter model")


async def adapter_scores(
    trained: dict[str, Any], final: str, ids: list[int], scratch: Path
) -> list[float]:
    spec = JobSpec.model_validate(trained["spec"]).model_copy(update={"local": {"device": "cpu"}})
    service = connect(JobSpec.model_validate(spec.model_dump()), scratch, lambda *_: None)
    sampler = await service.create_sampling_client_async("tiny-student", model_path=final)
    return (await sampler.compute_logprobs_async(ModelInput.from_ints(ids)))[1:]


def test_a_cancelled_job_is_exported_from_its_last_state(service, cli, tmp_path):
    job = service.submit(tiny_spec(steps=2000, save_every=2) | {"name": "cancelled"})
    service.wait(job["id"], until=lambda j: j["steps_done"] >= 3)
    with service.client() as client:
        client.jobs.cancel(job["id"])
    service.wait(job["id"])
    with service.client() as client:
        states = [c for c in client.jobs.checkpoints(job["id"]) if c.kind == "state"]

    exported = cli("export", str(job["id"]), str(tmp_path / "last"))
    merged = cli("export", str(job["id"]), str(tmp_path / "merged"), "--merge")
    none = cli("export", str(job["id"]), str(tmp_path / "none"), "--checkpoint", "1")

    assert exported.returncode == 0, exported.stderr
    assert exported.stderr == (
        f"job {job['id']} is cancelled and has no final weights: exporting its last state "
        f"(step {states[-1].step}) instead\n"
    )
    assert (tmp_path / "last" / "adapter_model.safetensors").is_file()
    assert merged.returncode == 0 and "Its logprobs match" in merged.stdout, merged.stderr
    assert none.returncode == 1
    assert none.stderr.startswith(
        f"error: job {job['id']} has no weights saved after step 1; it has weights saved after "
        "steps 2, "
    )
