"""Files of conversations: their format told by their first row's shape, every row checked
as OpenAI's validator checks a line (each problem named by its line or row and field, the
first ten shown, all counted), and the tally an upload's report gives."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kernel.chats.files import (
    MAX_SHOWN,
    ChatFileInvalid,
    check_chat_file,
    file_format,
    read_conversations,
)
from kernel.model_names import chat_tokens
from kernel.tables.bounds import TableLimits
from tests.chats import (
    INVALID_LINES,
    MULTIPLY,
    OPENAI_EACH,
    OPENAI_FILE,
    TRL_MESSAGES,
    answer,
    user,
    write_jsonl,
)

LIMITS = TableLimits()


def table(rows: list[dict]) -> pa.Table:
    """The rows as one table, its columns and structs the union of every row's fields
    (each missing one null), as Hugging Face's datasets write a chat dataset to Parquet."""
    return pa.Table.from_struct_array(pa.array(rows))


def test_the_format_is_told_by_the_first_rows_shape(tmp_path: Path):
    cases = {
        "messages": [{"messages": [user("a"), answer(1)]}],
        "prompt_completion": [{"prompt": [user("a")], "completion": [answer(1)]}],
        "prompt": [{"prompt": [user("a")]}],
        None: [{"prompt": "a question", "completion": "an answer"}],
    }
    for index, (format, rows) in enumerate(cases.items()):
        path = write_jsonl(tmp_path / f"{index}.jsonl", rows)
        assert file_format(path, "jsonl", LIMITS) == format
    pq.write_table(table(TRL_MESSAGES), tmp_path / "m.parquet")
    assert file_format(tmp_path / "m.parquet", "parquet", LIMITS) == "messages"
    assert file_format(tmp_path / "m.parquet", "csv", LIMITS) is None
    (tmp_path / "broken.jsonl").write_text("{not json\n")
    assert file_format(tmp_path / "broken.jsonl", "jsonl", LIMITS) is None


def test_the_hand_written_file_is_tallied(tmp_path: Path):
    path = write_jsonl(tmp_path / "train.jsonl", [*OPENAI_FILE, OPENAI_FILE[-1]])
    tally = check_chat_file(
        path,
        "jsonl",
        "messages",
        LIMITS,
        lambda c: chat_tokens(
            "arith-student", ((m["role"], m["content"]) for m in c.template_messages())
        ),
    )
    assert (tally.conversations, tally.prompts_last, tally.prompts_each) == (7, 7, OPENAI_EACH + 1)
    assert (tally.tool_calls, tally.with_tools, tally.duplicates, tally.without_prompts) == (
        1,
        1,
        1,
        0,
    )
    assert tally.roles == {"system": 3, "user": 9, "assistant": 10, "tool": 1}
    assert tally.assistant_turns == 10 and tally.trained_turns == 9
    longest = max(len(json.dumps(row)) for row in OPENAI_FILE)
    assert 0 < tally.longest_chars < longest and tally.longest_tokens is not None


def test_every_refusal_is_named_by_its_line_and_field(tmp_path: Path):
    rows = [OPENAI_FILE[0]] + [row for row, _, _ in INVALID_LINES]
    path = write_jsonl(tmp_path / "bad.jsonl", rows)
    with path.open("a") as out:
        out.write("\n{not json\n")  # a blank line is no row; line 9 does not parse
    with pytest.raises(ChatFileInvalid) as refused:
        check_chat_file(path, "jsonl", "messages", LIMITS)
    message = str(refused.value)
    assert message.startswith("7 rows are not conversations")
    for line, (_, field, words) in enumerate(INVALID_LINES, start=2):
        assert f"line {line}: {field}: {words}" in message, message
    assert "line 9: is not valid JSON" in message


def test_the_first_ten_problems_are_shown_and_all_counted(tmp_path: Path):
    bad = {"messages": [{"role": "bot", "content": "x"}, user("a"), answer(1, weight=3)]}
    path = write_jsonl(tmp_path / "bad.jsonl", [OPENAI_FILE[0]] + [bad] * 8)
    with pytest.raises(ChatFileInvalid) as refused:
        check_chat_file(path, "jsonl", "messages", LIMITS)
    message = str(refused.value)
    assert message.startswith("8 rows are not") and f"the first {MAX_SHOWN} of 16" in message
    assert message.count("line ") == MAX_SHOWN and "line 6: messages.0.role" in message


def test_a_file_without_a_prompt_is_refused(tmp_path: Path):
    path = write_jsonl(tmp_path / "read.jsonl", [{"messages": [user("a"), answer(1, weight=0)]}])
    with pytest.raises(ChatFileInvalid, match="no conversation gives a prompt"):
        check_chat_file(path, "jsonl", "messages", LIMITS)


def test_trls_prompt_completion_names_the_part_of_the_row_at_fault(tmp_path: Path):
    rows = [
        {
            "prompt": [user("a"), answer(0)],
            "completion": [answer(1)],
            "tools": json.dumps([MULTIPLY]),
        },
        {"prompt": [user("b")], "completion": [{"role": "tool", "content": "r"}]},
    ]
    path = write_jsonl(tmp_path / "pc.jsonl", rows)
    with pytest.raises(ChatFileInvalid) as refused:
        check_chat_file(path, "jsonl", "prompt_completion", LIMITS)
    assert "line 2: completion.0: a tool's reply answers no call" in str(refused.value)
    (first,) = read_conversations(
        write_jsonl(tmp_path / "ok.jsonl", rows[:1]), "jsonl", "prompt_completion", LIMITS
    )
    assert [m.weight for m in first.messages] == [None, 0, None]  # the prompt's answer is read
    assert first.points("each") == [2] and first.template_tools() == [MULTIPLY]


def test_a_parquet_file_is_read_by_row_its_missing_struct_fields_no_fields(tmp_path: Path):
    path = tmp_path / "chats.parquet"
    pq.write_table(table(OPENAI_FILE), path)
    conversations = read_conversations(path, "parquet", "messages", LIMITS)
    assert [c.model_dump(exclude_none=True) for c in conversations] == [
        c.model_dump(exclude_none=True)
        for c in map(type(conversations[0]).model_validate, OPENAI_FILE)
    ]
    bad = [*OPENAI_FILE[:2], {"messages": [{"role": "bot", "content": "x"}, user("a")]}]
    pq.write_table(table(bad), path)
    with pytest.raises(ChatFileInvalid, match=r"row 3: messages\.0\.role"):
        check_chat_file(path, "parquet", "messages", LIMITS)
