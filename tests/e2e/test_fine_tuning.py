"""OpenAI's fine-tuning doors against real `opd api` and `opd worker` processes, with the
official `openai` package as the client: a fine-tuning file written by hand (a system
line, two-turn chats whose first answer weighs 0, a tool call and its reply) uploaded with
`files.create(purpose="fine-tune")`, trained for two steps on the arithmetic presets by
`fine_tuning.jobs.create` (the first on the file's own assistant turns, `loop.cold_start`),
followed with `list_events` and `checkpoints.list`, and its `fine_tuned_model` answering a
chat with the tool's reply at once, read in the tokens training read such a prompt in. A
TRL `messages` dataset takes the same path through the SDK, its held-out conversations
graded on their references, and is listed among the fine-tuning jobs."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from kernel.chats.conversation import Conversation
from kernel.spec import PromptOptions
from tests.chats import MULTIPLY, OPENAI_FILE, TRL_MESSAGES, jsonl_bytes, write_jsonl
from tests.e2e.conftest import Service, deployment
from tests.e2e.test_openai import client_of
from worker.engine.backends.local.presets import preset_tokenizer
from worker.engine.teachers.views import Renderer

LOOP = {"steps": 2, "batch_size": 2, "group_size": 2, "save_every": 1}
DISTILLATION = {
    "type": "distillation",
    "distillation": {
        "teacher": {"base_model": "arith-teacher"},
        "dataset": {"turns": "each"},
        "loop": LOOP | {"cold_start": {"steps": 1, "source": "reference"}},
        "sampling": {"max_tokens": 8},
    },
}
ENDED = {"succeeded", "failed", "cancelled"}


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    home = tmp_path_factory.mktemp("fine-tuning")
    with deployment(home, f"sqlite:///{home / 'opd.db'}") as running:
        running.start_worker()
        yield running


def followed(client: openai.OpenAI, job_id: str, service: Service):
    deadline = time.monotonic() + 600
    while (job := client.fine_tuning.jobs.retrieve(job_id)).status not in ENDED:
        assert time.monotonic() < deadline, f"{job}\n{service.logs()}"
        time.sleep(0.5)
    return job


def test_the_openai_package_trains_a_chat_file_and_chats_with_the_model_at_once(service):
    client = client_of(service)
    uploaded = client.files.create(
        file=("train.jsonl", jsonl_bytes(OPENAI_FILE)), purpose="fine-tune"
    )
    made = client.fine_tuning.jobs.create(
        model="arith-student",
        training_file=uploaded.id,
        suffix="chats",
        seed=3,
        metadata={"from": "openai"},
        method=DISTILLATION,  # type: ignore[arg-type]
    )
    assert made.status in {"queued", "running"}
    job = followed(client, made.id, service)
    number = int(made.id.removeprefix("ftjob-"))
    assert job.status == "succeeded", (job, service.logs())
    assert job.fine_tuned_model == f"job-{number}" and job.trained_tokens
    assert job.finished_at and job.training_file == uploaded.id

    events = client.fine_tuning.jobs.list_events(made.id, limit=100).data
    assert len(events) >= 3 and events[0].created_at >= events[-1].created_at
    assert any("succeeded" in event.message.lower() for event in events[:3]), events[:3]
    saved = client.fine_tuning.jobs.checkpoints.list(made.id).data
    assert {c.fine_tuned_model_checkpoint for c in saved} >= {
        f"job-{number}",
        f"job-{number}@step-1",
    }
    assert all("opd/reverse_kl_mean" in (c.metrics.model_extra or {}) for c in saved)

    tool_chat = OPENAI_FILE[1]["messages"][:4]  # up to the tool's reply
    for model in (job.fine_tuned_model, f"job-{number}@step-1"):
        answer = client.chat.completions.create(
            model=model, messages=tool_chat, tools=[MULTIPLY], max_tokens=8, temperature=0
        )
        assert isinstance(answer.choices[0].message.content, str)
    trained_as = Renderer(preset_tokenizer("arith-student"))(
        Conversation.model_validate({"messages": tool_chat, "tools": [MULTIPLY]}), PromptOptions()
    )
    assert answer.usage.prompt_tokens == len(trained_as)

    kept = httpx.get(
        f"{service.url}/v1/jobs/{number}/samples",
        headers={"Authorization": f"Bearer {service.key}"},
        timeout=30,
    ).json()["data"]
    assert kept and all(sample["prompt"].startswith(("system: ", "user: ")) for sample in kept)


def test_a_trl_messages_dataset_trains_through_the_sdk_and_is_listed_by_the_door(
    service, tmp_path: Path
):
    path = write_jsonl(tmp_path / "trl.jsonl", TRL_MESSAGES)
    with service.client() as sdk:
        uploaded = sdk.files.upload(path, model="arith-student", progress=False)
        assert uploaded.report.chat is not None and uploaded.report.chat.format == "messages"
        job = sdk.jobs.create(
            {
                "backend": "local",
                "name": "trl-messages",
                "student": {"base_model": "arith-student"},
                "teacher": {"base_model": "arith-teacher"},
                "dataset": {"source": "file", "file": uploaded.id, "sample_size": 4},
                "loop": LOOP,
                "sampling": {"max_tokens": 8},
                "eval": {"holdout": 2},
            }
        )
    done = service.wait(job.id, timeout=600)
    assert done["status"] == "succeeded", service.logs()
    assert done["spec"]["dataset"]["answer_field"] == "messages"
    curve = service.curve(job.id, "eval/accuracy")
    assert curve and all(value is not None and 0 <= value <= 1 for _, value in curve)
    listed = {j.id: j for j in client_of(service).fine_tuning.jobs.list(limit=100).data}
    assert listed[f"ftjob-{job.id}"].training_file == uploaded.id
    assert listed[f"ftjob-{job.id}"].fine_tuned_model == f"job-{job.id}"
