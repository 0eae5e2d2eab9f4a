"""Files of conversations uploaded as OpenAI's and TRL's tools write them, with the official
`openai` package as the client, on SQLite and Postgres, a folder store and a bucket: the
report says the format and counts conversations, turns, roles and tool calls; a file with
rows OpenAI's fine-tuning validator refuses is a 422 listing each problem with its line,
and nothing is kept; a job names the file as any other."""

from __future__ import annotations

import io
import json

import openai
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kernel.chats.conversation import Conversation
from tests.app.conftest import auth, small_spec
from tests.app.files.test_upload_form import nothing_kept
from tests.chats import INVALID_LINES, OPENAI_EACH, OPENAI_FILE, answer, jsonl_bytes, user
from worker.engine.backends.local.presets import preset_tokenizer

pytestmark = pytest.mark.usefixtures("key")


def longest_tokens() -> int:
    """The longest conversation of the hand-written file in arith-student's tokens, as its
    template renders it whole."""
    tokenizer = preset_tokenizer("arith-student")
    return max(
        len(tokenizer.encode(text, add_special_tokens=False))
        for row in OPENAI_FILE
        for text in [
            tokenizer.apply_chat_template(
                Conversation.model_validate(row).template_messages(calls_as_text=True),
                tokenize=False,
            )
        ]
    )


async def report_of(client, key, file_id: str) -> dict:
    answer = await client.get(f"/v1/files/{file_id}", headers=auth(key))
    assert answer.status_code == 200, answer.text
    return answer.json()


async def test_the_hand_written_file_is_read_as_conversations(openai_client, client, key):
    uploaded = await openai_client.files.create(
        file=("train.jsonl", jsonl_bytes(OPENAI_FILE)),
        purpose="fine-tune",
        extra_query={"model": "arith-student"},
    )
    assert (uploaded.object, uploaded.status, uploaded.purpose) == (
        "file",
        "processed",
        "fine-tune",
    )
    detail = await report_of(client, key, uploaded.id)
    assert (detail["question_field"], detail["answer_field"]) == ("messages", "messages")
    chat = detail["report"]["chat"]
    assert chat["format"] == "messages" and chat["conversations"] == len(OPENAI_FILE)
    assert (chat["prompts_last"], chat["prompts_each"]) == (len(OPENAI_FILE), OPENAI_EACH)
    assert chat["roles"] == {"system": 3, "user": 8, "assistant": 9, "tool": 1}
    assert (chat["tool_calls"], chat["with_tools"], chat["without_prompts"]) == (1, 1, 0)
    assert chat["tokens_of"] == "arith-student" and chat["longest_tokens"] == longest_tokens()
    assert [c["name"] for c in detail["report"]["columns"]] == ["messages"]

    job = await client.post(
        "/v1/jobs",
        json=small_spec(dataset={"source": "file", "file": uploaded.id}),
        headers=auth(key),
    )
    assert job.status_code == 201, job.text
    dataset = job.json()["spec"]["dataset"]
    assert (dataset["field"], dataset["answer_field"], dataset["turns"]) == (
        "messages",
        "messages",
        "last",
    )
    column = small_spec(dataset={"source": "file", "file": uploaded.id, "field": "question"})
    refused = await client.post("/v1/jobs", json=column, headers=auth(key))
    assert refused.status_code == 422 and refused.json()["error"]["param"] == "dataset.field"
    assert "holds conversations" in refused.json()["error"]["message"]


async def test_trls_prompt_completion_parquet_is_read_by_its_shape(openai_client, client, key):
    rows = [
        {"prompt": [user(f"What is {n} + 1?")], "completion": [answer(n + 1)]} for n in range(4)
    ]
    buffer = io.BytesIO()
    pq.write_table(pa.Table.from_struct_array(pa.array(rows)), buffer)
    uploaded = await openai_client.files.create(
        file=("trl.parquet", buffer.getvalue()), purpose="fine-tune"
    )
    detail = await report_of(client, key, uploaded.id)
    assert (detail["question_field"], detail["answer_field"]) == ("prompt", "completion")
    assert detail["report"]["chat"]["format"] == "prompt_completion"
    assert detail["report"]["chat"]["longest_tokens"] is None  # no model named


@pytest.mark.parametrize(("row", "field", "words"), INVALID_LINES)
async def test_each_refusal_of_openais_validator_is_a_422_with_its_line_and_nothing_kept(
    openai_client, client, key, settings, row, field, words
):
    with pytest.raises(openai.UnprocessableEntityError) as refused:
        await openai_client.files.create(
            file=("bad.jsonl", jsonl_bytes([*OPENAI_FILE[:2], row])), purpose="fine-tune"
        )
    error = refused.value.body  # the client's: the body's `error`
    assert isinstance(error, dict) and refused.value.code == "invalid_chat_file"
    assert f"line 3: {field}: {words}" in error["message"], error
    assert error["message"].startswith("1 row is not conversations")
    assert "nothing was stored" in error["message"]
    await nothing_kept(client, key, settings)


async def test_a_file_of_conversations_takes_no_columns(client, key, settings):
    answer = await client.post(
        "/v1/files",
        params={"filename": "train.jsonl", "field": "messages"},
        content=jsonl_bytes(OPENAI_FILE),
        headers=auth(key),
    )
    assert answer.status_code == 422 and answer.json()["error"]["param"] == "field"
    assert "holds conversations" in answer.json()["error"]["message"]
    await nothing_kept(client, key, settings)


async def test_a_table_whose_prompt_column_is_text_stays_a_table(client, key):
    rows = [{"prompt": "What is 1 + 1?", "completion": "2"}]
    answer = await client.post(
        "/v1/files",
        params={"filename": "t.jsonl"},
        content="".join(json.dumps(row) + "\n" for row in rows).encode(),
        headers=auth(key),
    )
    assert answer.status_code == 201, answer.text
    assert answer.json()["report"]["chat"] is None and answer.json()["question_field"] == "prompt"
