"""Reading an uploaded file once, in batches, to decide whether it can serve as a dataset
(report.py; a file of conversations, kernel/chats/files.py) and to write its report. An
upload is inspected in a confined child (`inspect_upload`): a file that crashes its
reader, or unpacks out of proportion, is a 422 and never the API's end (kernel/tables).
Blocking: it reads the whole file.

JSONL and CSV must be UTF-8 (the workers' reader decodes them so; Arrow's JSON reader would
let broken bytes through), checked incrementally first. A truncated Parquet file is
refused by its missing footer.
"""

from __future__ import annotations

import codecs
from functools import partial
from pathlib import Path
from typing import Any

import pyarrow
import pyarrow.parquet

from app.files.errors import FileRefused
from app.files.report import (
    PREVIEW_ROWS,
    QuestionTally,
    answer_field,
    preview,
    question_field,
    unusable,
)
from app.files.schemas import ChatReport, FileColumn, FileFormat, FileReport
from kernel.chats.conversation import Conversation
from kernel.chats.files import (
    CONVERSATION_COLUMNS,
    FORMAT_WORDS,
    ChatFileInvalid,
    ChatFormat,
    check_chat_file,
    file_format,
)
from kernel.errors import FileTooComplex, FileUnreadable
from kernel.json_types import json_type
from kernel.model_names import chat_tokens
from kernel.tables.bounds import TableLimits
from kernel.tables.reading import Batches, confined_read, parse_failure, read_table_file

CHUNK = 1 << 20
DEFAULT_LIMITS = TableLimits()


def inspect_upload(
    path: Path,
    kind: FileFormat,
    field: str | None,
    answers: str | None,
    limits: TableLimits,
    model: str | None = None,
) -> FileReport:
    """`inspect_file` in a confined child: what the file does to its reader there, a crash
    included, is a FileRefused (422)."""
    try:
        return confined_read(inspect_file, path, kind, limits, field, answers, model)
    except (FileTooComplex, FileUnreadable) as refused:
        raise FileRefused(422, refused.code, str(refused)) from None


def inspect_file(
    path: Path,
    kind: FileFormat,
    field: str | None,
    answers: str | None,
    model: str | None = None,
    limits: TableLimits = DEFAULT_LIMITS,
) -> FileReport:
    """The report of the file at `path`, a table of questions or a file of conversations
    (by its first row's shape); FileRefused (422) saying why it cannot be a dataset,
    FileTooComplex past one of `limits`."""
    if kind is not FileFormat.parquet:
        check_utf8(path)
    chats = file_format(path, kind.value, limits)
    try:
        if chats is not None:
            return chat_report(path, kind, chats, field or answers, model, limits)
        return read_table_file(
            path, kind.value, limits, partial(report_of, field=field, answers=answers)
        )
    except MemoryError:  # Arrow's too: the confined child's to answer, not a parse error
        raise
    except (pyarrow.ArrowException, OSError) as error:
        raise unusable(parse_failure(kind.value, error)) from None


def chat_report(
    path: Path,
    kind: FileFormat,
    chats: ChatFormat,
    column: str | None,
    model: str | None,
    limits: TableLimits,
) -> FileReport:
    """The report of a file of conversations, each row checked as OpenAI's fine-tuning
    validator checks a line (the first problems, with their lines, are the 422's); a
    `field` or `answer_field` given is refused: the rows' shape says where each is."""
    if column is not None:
        raise unusable(
            f"the file holds {FORMAT_WORDS[chats]}: field and answer_field name the columns "
            "of a table of questions; leave them out",
            "field",
        )

    def tokens(conversation: Conversation) -> int | None:
        messages = conversation.template_messages(calls_as_text=True)  # as the presets read
        return chat_tokens(model, ((m["role"], m["content"]) for m in messages)) if model else None

    try:
        tally = check_chat_file(path, kind.value, chats, limits, tokens)
    except ChatFileInvalid as invalid:
        raise FileRefused(422, invalid.code, f"{invalid} (nothing was stored)") from None
    first = tally.preview[0] if tally.preview else {}
    conversations = CONVERSATION_COLUMNS[chats]
    return FileReport(
        rows=tally.conversations,
        columns=columns_of(path, kind, first),
        question_field=conversations,
        answer_field={"messages": "messages", "prompt_completion": "completion"}.get(chats),
        empty_questions=tally.without_prompts,
        duplicate_questions=tally.duplicates,
        preview=preview(tally.preview),
        chat=ChatReport(
            format=chats,
            conversations=tally.conversations,
            messages=tally.messages,
            roles=dict(tally.roles),
            assistant_turns=tally.assistant_turns,
            trained_turns=tally.trained_turns,
            prompts_last=tally.prompts_last,
            prompts_each=tally.prompts_each,
            without_prompts=tally.without_prompts,
            tool_calls=tally.tool_calls,
            with_tools=tally.with_tools,
            duplicates=tally.duplicates,
            longest_chars=tally.longest_chars,
            longest_tokens=tally.longest_tokens,
            tokens_of=model if tally.longest_tokens is not None else None,
        ),
    )


def columns_of(path: Path, kind: FileFormat, first: dict[str, Any]) -> list[FileColumn]:
    """A Parquet file's columns with their Arrow types; a JSONL file's first row's keys,
    with their JSON types."""
    if kind is FileFormat.parquet:
        schema = pyarrow.parquet.read_schema(path)
        return [FileColumn(name=name, type=str(schema.field(name).type)) for name in schema.names]
    return [FileColumn(name=key, type=json_type(value) or "null") for key, value in first.items()]


def report_of(batches: Batches, field: str | None, answers: str | None) -> FileReport:
    schema, rows = batches
    columns = {name: str(schema.field(name).type) for name in schema.names}
    question = question_field(columns, field)
    answer = answer_field(columns, answers, question)
    tally, first = QuestionTally(), []
    for batch in rows:
        if len(first) < PREVIEW_ROWS:
            first.extend(python(batch.slice(0, PREVIEW_ROWS - len(first))))
        tally.add(python(batch.column(question)))
    tally.check(question)
    return FileReport(
        rows=tally.rows,
        columns=[FileColumn(name=name, type=arrow) for name, arrow in columns.items()],
        question_field=question,
        answer_field=answer,
        empty_questions=tally.empty,
        duplicate_questions=tally.duplicates,
        preview=preview(first),
        question_bytes=tally.question_bytes(),
    )


def python(values: pyarrow.Array | pyarrow.RecordBatch) -> list[Any]:
    """The values as Python's; one Python has no form for (a date past the year 9999) is a
    422."""
    try:
        return values.to_pylist()
    except (ValueError, OverflowError) as error:
        raise unusable(f"the file holds a value that cannot be read: {error}") from None


def check_utf8(path: Path) -> None:
    """Refuses a text file that is not UTF-8, naming the line and byte where it breaks."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset, line = 0, 1
    with path.open("rb") as source:
        while True:
            chunk = source.read(CHUNK)
            try:
                decoder.decode(chunk, final=not chunk)
            except UnicodeDecodeError as error:
                at = offset + error.start
                line += chunk[: error.start].count(b"\n")
                raise FileRefused(
                    422,
                    "not_utf8",
                    f"the file is not UTF-8 text: byte {at} (line {line}) is not valid UTF-8; "
                    "save it as UTF-8",
                ) from None
            if not chunk:
                return
            offset += len(chunk)
            line += chunk.count(b"\n")
