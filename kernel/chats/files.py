"""Files of conversations, one a JSONL line or a Parquet row, in the format their first row's
shape says: OpenAI's fine-tuning format and TRL's conversational language modeling
(`messages`, and `tools`), TRL's conversational prompt-completion (`prompt` and
`completion`, each a list of messages: the completion's assistant turns are the ones
answered) or prompt-only (`prompt`: the whole is one prompt).

A file is checked whole (`check_chat_file`), every row against the rules of
`conversation.py` as OpenAI's validator checks a line: each problem is named with its line
(or row) and field, the first MAX_SHOWN of them shown, all counted; its tally is what an
upload's report says. A JSONL file is read with Python's JSON reader a line at a time (a
conversation's fields differ from line to line, which Arrow's reader refuses), within the
bounds of kernel/tables (line length, nesting); a Parquet file in Arrow's batches.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow
import pyarrow.parquet
from pydantic import Field, ValidationError

from kernel.chats.conversation import ChatFormat, ChatMessage, ChatPart, Conversation, Tool
from kernel.errors import OPDError
from kernel.tables.bounds import TableLimits, check_text
from kernel.tables.reading import open_batches
from kernel.wording import problems, shown

FORMAT_WORDS: dict[ChatFormat, str] = {
    "messages": "conversations (`messages`: OpenAI's fine-tuning format, TRL's "
    "conversational language modeling)",
    "prompt_completion": "TRL's conversational prompt-completion (`prompt`, `completion`)",
    "prompt": "TRL's conversational prompt-only (`prompt`)",
}
CONVERSATION_COLUMNS: dict[ChatFormat, str] = {
    "messages": "messages",
    "prompt_completion": "prompt",
    "prompt": "prompt",
}
"""The column that holds each format's conversations (a dataset's `field` for it)."""
MAX_SHOWN = 10
"""The problems a refusal lists (all are counted)."""
PREVIEW_ROWS = 5


class ChatFileInvalid(OPDError):
    """A file of conversations with rows OpenAI's validator would refuse; the message lists
    the first ones, each with its line."""

    code = "invalid_chat_file"


def row_format(row: Any) -> ChatFormat | None:
    """The format a row's shape says, or None for a row of a table of questions."""
    if not isinstance(row, dict):
        return None
    if isinstance(row.get("messages"), list):
        return "messages"
    if isinstance(row.get("prompt"), list):
        return "prompt_completion" if "completion" in row else "prompt"
    return None


def is_list(kind: pyarrow.DataType) -> bool:
    return pyarrow.types.is_list(kind) or pyarrow.types.is_large_list(kind)


def file_format(path: Path, kind: str, limits: TableLimits) -> ChatFormat | None:
    """The format of a file of conversations, by its first row (JSONL) or its columns
    (Parquet); None for any other file (a table of questions, a CSV, one that does not
    parse or is past a bound: the table's reader says why)."""
    if kind == "jsonl":
        with path.open("rb") as lines:
            while line := lines.readline(limits.row_bytes + 1):
                if len(line) > limits.row_bytes:
                    return None
                if line.strip():
                    try:
                        return row_format(json.loads(line))
                    except (ValueError, RecursionError):  # a 5,000-digit number is a ValueError
                        return None
        return None
    if kind != "parquet":
        return None
    try:
        schema = pyarrow.parquet.read_schema(path)
    except (pyarrow.ArrowException, OSError):
        return None
    types = {name: schema.field(name).type for name in schema.names}
    if "messages" in types and is_list(types["messages"]):
        return "messages"
    if "prompt" in types and is_list(types["prompt"]):
        return "prompt_completion" if "completion" in types else "prompt"
    return None


class PromptRow(ChatPart):
    """TRL's conversational prompt-only: the prompt is read, the next turn answered."""

    prompt: list[ChatMessage] = Field(min_length=1)
    tools: list[Tool] | None = None

    def joined(self) -> list[ChatMessage]:
        """The row's messages as one conversation's: the prompt's assistant turns read,
        never answered (weight 0)."""
        return [
            message.model_copy(update={"weight": 0}) if message.role == "assistant" else message
            for message in self.prompt
        ]


class PromptCompletionRow(PromptRow):
    """TRL's conversational prompt-completion: the prompt's turns are read, the
    completion's assistant turns answered."""

    completion: list[ChatMessage] = Field(min_length=1)

    def joined(self) -> list[ChatMessage]:
        return [*super().joined(), *self.completion]


ROW_MODELS: dict[ChatFormat, type[Conversation | PromptRow]] = {
    "messages": Conversation,
    "prompt_completion": PromptCompletionRow,
    "prompt": PromptRow,
}


class RowRefused(Exception):
    """A row's problems, each `field: what is wrong`."""

    def __init__(self, found: list[str]) -> None:
        super().__init__("; ".join(found))
        self.found = found


Moved = Callable[[tuple[Any, ...]], tuple[Any, ...]]


def refused(error: ValidationError, model: type[ChatPart], moved: Moved) -> RowRefused:
    located = [e | {"loc": moved(tuple(e["loc"]))} for e in error.errors()]
    return RowRefused([f"{at or 'the row'}: {what}" for at, what in problems(located, model)])


def conversation_of(row: Any, format: ChatFormat) -> Conversation:
    """The conversation a row holds (its other columns set aside); RowRefused naming each
    problem's field as the row names it."""
    if not isinstance(row, dict):
        raise RowRefused([f"the row: should be a JSON object, not {shown(row)}"])
    model = ROW_MODELS[format]
    fields = {key: row[key] for key in model.model_fields if key in row}
    if "tools" in fields:
        fields["tools"] = listed_tools(fields["tools"])
    try:
        parsed = model.model_validate(fields)
    except ValidationError as error:
        raise refused(error, model, lambda loc: loc) from None
    if isinstance(parsed, Conversation):
        return parsed
    messages = parsed.joined()
    prompt_length = len(parsed.prompt)
    try:
        return Conversation.model_validate({"messages": messages, "tools": parsed.tools})
    except ValidationError as error:
        raise refused(error, model, lambda loc: in_parts(loc, prompt_length)) from None


def listed_tools(tools: Any) -> Any:
    """A row's tools: a list, or (as TRL's datasets often store them) its JSON text."""
    if isinstance(tools, str):
        try:
            return json.loads(tools)
        except (ValueError, RecursionError):
            return tools  # refused as not a list
    return tools


def in_parts(loc: tuple[Any, ...], prompt_length: int) -> tuple[Any, ...]:
    """A location in the joined messages as the row names it: in `prompt` or `completion`."""
    if len(loc) < 2 or loc[0] != "messages" or not isinstance(loc[1], int):
        return ("prompt", *loc[1:]) if loc and loc[0] == "messages" else loc
    index = loc[1]
    if index < prompt_length:
        return ("prompt", index, *loc[2:])
    return ("completion", index - prompt_length, *loc[2:])


def without_nulls(value: Any) -> Any:
    """A Parquet row as the JSON it was written from: a struct's missing fields are nulls
    there, and a null field is no field."""
    if isinstance(value, dict):
        return {key: without_nulls(item) for key, item in value.items() if item is not None}
    if isinstance(value, list):
        return [without_nulls(item) for item in value]
    return value


@dataclass(frozen=True)
class BadJson:
    """A JSONL line that does not parse."""

    reason: str


def rows(path: Path, kind: str, limits: TableLimits) -> Iterator[tuple[int, Any]]:
    """Each row with its number (a JSONL file's line, a Parquet file's row, from 1): its
    value, or BadJson. A JSONL file's blank lines are no rows."""
    if kind == "jsonl":
        check_text(path, limits, json=True)
        with path.open("rb") as lines:
            for number, line in enumerate(lines, start=1):
                if not line.strip():
                    continue
                try:
                    yield number, json.loads(line)
                except json.JSONDecodeError as error:
                    yield number, BadJson(f"{error.msg} at column {error.colno}")
                except (ValueError, RecursionError) as error:  # a number past 4,300 digits
                    yield number, BadJson(str(error) or "nested too deep")
        return
    _, batches = open_batches(path, "parquet", limits, 0)
    number = 0
    for batch in batches:
        for row in batch.to_pylist():
            number += 1
            yield number, without_nulls(row)


@dataclass
class ChatTally:
    """What a check of a file of conversations found: its rows' problems (the first
    MAX_SHOWN, and how many), and the counts an upload's report gives."""

    format: ChatFormat
    where: str
    """How rows are numbered: `line` (JSONL) or `row` (Parquet)."""
    conversations: int = 0
    messages: int = 0
    roles: Counter[str] = field(default_factory=Counter)
    assistant_turns: int = 0
    trained_turns: int = 0
    prompts_last: int = 0
    prompts_each: int = 0
    without_prompts: int = 0
    tool_calls: int = 0
    with_tools: int = 0
    duplicates: int = 0
    longest_chars: int = 0
    longest_tokens: int | None = None
    shown: list[str] = field(default_factory=list)
    problems: int = 0
    refused_rows: int = 0
    preview: list[Any] = field(default_factory=list)
    seen: set[bytes] = field(default_factory=set, repr=False)

    def problem(self, number: int, what: str) -> None:
        self.problems += 1
        if len(self.shown) < MAX_SHOWN:
            self.shown.append(f"{self.where} {number}: {what}")

    def add(self, conversation: Conversation, tokens: int | None) -> None:
        self.conversations += 1
        self.messages += len(conversation.messages)
        self.roles.update(message.role for message in conversation.messages)
        self.assistant_turns += sum(m.role == "assistant" for m in conversation.messages)
        self.trained_turns += sum(m.trained for m in conversation.messages)
        self.tool_calls += sum(len(m.tool_calls or []) for m in conversation.messages)
        self.with_tools += bool(conversation.tools)
        each = len(conversation.points("each"))
        self.prompts_each += each
        self.prompts_last += min(each, 1)
        self.without_prompts += not each
        self.longest_chars = max(self.longest_chars, len(conversation.text()))
        if tokens is not None:
            self.longest_tokens = max(self.longest_tokens or 0, tokens)
        digest = hashlib.blake2b(conversation.key().encode(), digest_size=16).digest()
        if digest in self.seen:
            self.duplicates += 1
        else:
            self.seen.add(digest)

    def refusal(self) -> ChatFileInvalid | None:
        """The file's refusal: its problems (and a file with no prompt is one)."""
        if not self.problems and not self.prompts_each:
            what = "no conversation" if not self.conversations else "no conversation gives a prompt"
            return ChatFileInvalid(
                f"the file holds {what}: a prompt is a conversation up to an assistant turn "
                "trained on (weight 1) after a user turn, or one that ends with a user's turn"
            )
        if not self.problems:
            return None
        rows = f"{self.refused_rows} {'row is' if self.refused_rows == 1 else 'rows are'}"
        more = (
            f", the first {len(self.shown)} of {self.problems}" if self.problems > MAX_SHOWN else ""
        )
        return ChatFileInvalid(
            f"{rows} not {FORMAT_WORDS[self.format]} as OpenAI's fine-tuning validator reads "
            f"them. Its problems{more}: " + "; ".join(self.shown)
        )


def check_chat_file(
    path: Path,
    kind: str,
    format: ChatFormat,
    limits: TableLimits,
    tokens: Callable[[Conversation], int | None] = lambda _: None,
) -> ChatTally:
    """Every row of the file read as `format`, its problems and counts tallied (`tokens`
    counts a conversation in a model's tokens, where it can); ChatFileInvalid listing the
    first problems. Bounded as tables are (kernel/tables/bounds.py)."""
    tally = ChatTally(format, "line" if kind == "jsonl" else "row")
    for number, row in rows(path, kind, limits):
        if isinstance(row, BadJson):
            tally.refused_rows += 1
            tally.problem(number, f"is not valid JSON ({row.reason})")
            continue
        if len(tally.preview) < PREVIEW_ROWS and isinstance(row, dict):
            tally.preview.append(row)
        try:
            conversation = conversation_of(row, format)
        except RowRefused as refusal:
            tally.refused_rows += 1
            for found in refusal.found:
                tally.problem(number, found)
            continue
        tally.add(conversation, tokens(conversation))
    if (refusal := tally.refusal()) is not None:
        raise refusal
    return tally


def read_conversations(
    path: Path, kind: str, format: ChatFormat, limits: TableLimits
) -> list[Conversation]:
    """The file's conversations, in its order (a file that was checked: a row refused now
    is a ChatFileInvalid naming it)."""
    conversations = []
    for number, row in rows(path, kind, limits):
        where = "line" if kind == "jsonl" else "row"
        if isinstance(row, BadJson):
            raise ChatFileInvalid(f"{where} {number}: is not valid JSON ({row.reason})")
        try:
            conversations.append(conversation_of(row, format))
        except RowRefused as refusal:
            raise ChatFileInvalid(f"{where} {number}: {refusal}") from None
    return conversations
