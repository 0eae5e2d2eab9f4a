"""The public bodies of the Files API."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from app.core.pages import ObjectList
from kernel.chats.conversation import ChatFormat

FILE_ID_PATTERN = r"^file-[1-9][0-9]{0,9}$"
FILE_CURSOR_PATTERN = r"^(file-)?[1-9][0-9]{0,9}$"
"""What a list's `after` takes: a file's id (a page's `last_id`), or its number (the old
`next_cursor`)."""
DEFAULT_PURPOSE = "fine-tune"
"""A file's purpose when its upload named none: what this service's files are for."""
MAX_PURPOSE_CHARS = 64


class FileFormat(StrEnum):
    jsonl = "jsonl"
    parquet = "parquet"
    csv = "csv"


class FileColumn(BaseModel):
    name: str
    type: str = Field(
        description="Its Arrow type, e.g. `string`, `int64` (a JSONL file of conversations: "
        "its first row's JSON type, e.g. `array`)."
    )


class ChatReport(BaseModel):
    """What the upload found in a file of conversations (docs/how-to/chats.md)."""

    format: ChatFormat = Field(
        description="By the rows' shape: `messages` (OpenAI's fine-tuning format, TRL's "
        "conversational language modeling), `prompt_completion` or `prompt` (TRL's "
        "conversational prompt-completion and prompt-only)."
    )
    conversations: int
    messages: int
    roles: dict[str, int] = Field(description="Messages by role.")
    assistant_turns: int
    trained_turns: int = Field(description="Assistant turns with weight 1 (the default).")
    prompts_last: int = Field(description="Prompts with `dataset.turns: last` (the default).")
    prompts_each: int = Field(description="Prompts with `dataset.turns: each`.")
    without_prompts: int = Field(
        description="Conversations that give no prompt (every assistant turn weight 0)."
    )
    tool_calls: int
    with_tools: int = Field(description="Conversations that declare `tools`.")
    duplicates: int = Field(description="Conversations an earlier row has whole.")
    longest_chars: int = Field(description="The longest conversation's text, in characters.")
    longest_tokens: int | None = Field(
        None,
        description="The longest conversation in tokens of the upload's `model`, rendered by "
        "its chat template, where the service counts them without loading it (the byte-level "
        "presets); null otherwise.",
    )
    tokens_of: str | None = Field(None, description="The model `longest_tokens` counts in.")


class QuestionBytes(BaseModel):
    """The non-empty questions' lengths in UTF-8 bytes."""

    shortest: int
    mean: float
    longest: int


class FileReport(BaseModel):
    """What the upload found: the shape, the fields a dataset reads, and a few rows."""

    rows: int
    columns: list[FileColumn]
    question_field: str = Field(
        description="The column of questions, given or guessed (of conversations: `messages` "
        "or `prompt`)."
    )
    answer_field: str | None = Field(
        description="The column of reference answers (for eval), given or guessed (of "
        "conversations: the one whose assistant turns are answered); null = none."
    )
    empty_questions: int = Field(
        description="Rows whose question is null or blank (skipped); conversations that give "
        "no prompt."
    )
    duplicate_questions: int = Field(description="Rows whose question an earlier row has.")
    preview: list[dict[str, Any]] = Field(description="The first rows, long values cut short.")
    question_bytes: QuestionBytes | None = Field(
        None,
        description="The questions' lengths (what an estimate counts a prompt from); null for "
        "a file uploaded before they were measured.",
    )
    chat: ChatReport | None = Field(
        None, description="A file of conversations: what its conversations hold; else null."
    )


class FilePublic(BaseModel):
    """A file, with what OpenAI's File object has, so that OpenAI's clients read it
    (`created_at` stays ISO 8601)."""

    id: str = Field(description="`file-<n>`: what a spec names (`dataset.file`).")
    object: Literal["file"] = "file"
    filename: str
    format: FileFormat
    bytes: int
    sha256: str = Field(description="Of its bytes; the same bytes are stored once.")
    rows: int
    question_field: str
    answer_field: str | None
    purpose: str = Field(
        description="OpenAI's upload form's `purpose`, as sent; `fine-tune` when none was."
    )
    status: Literal["processed"] = Field(
        "processed", description="Always `processed`: the file was checked and stored."
    )
    created_at: datetime


class FileDetail(FilePublic):
    report: FileReport


class FilesPage(ObjectList[FilePublic]):
    """Newest first (`order=asc`: oldest first); while `has_more`, pass `last_id` as
    `after` for the next page."""

    next_cursor: int | None = Field(
        None,
        description="Deprecated, goes in the next release: the last file's number when more "
        "follow (`after` takes it, as it takes `last_id`).",
    )


class UploadForm(BaseModel):
    """POST /v1/files as OpenAI's upload form (`multipart/form-data`): the file and its
    fields, each field before the `file` part (but `purpose`, which may follow it)."""

    model_config = ConfigDict(extra="forbid")

    purpose: str | None = Field(
        None,
        min_length=1,
        max_length=MAX_PURPOSE_CHARS,
        description="What OpenAI's clients send (`fine-tune`, `assistants`, `batch`, ...): "
        "kept and answered back (`fine-tune` when none is sent); `GET /v1/files?purpose=` "
        "lists a purpose's files.",
    )
    format: FileFormat | None = Field(None, description="Default: from the file name.")
    field: str | None = Field(None, min_length=1, max_length=200)
    answer_field: str | None = Field(None, min_length=1, max_length=200)
    model: str | None = Field(
        None,
        min_length=1,
        max_length=500,
        description="A file of conversations: the model whose tokens the report counts the "
        "longest one in (where the service can: the byte-level presets).",
    )
    file: bytes = Field(
        description="The file; its name is the part's `filename` (else the `filename` query "
        "parameter's)."
    )


def form_schema() -> dict[str, Any]:
    """UploadForm as an OpenAPI form body: each field a string (none null), the file binary."""
    schema = UploadForm.model_json_schema(ref_template="#/components/schemas/{model}")
    schema.pop("$defs", None)
    for name, described in schema["properties"].items():
        kinds = [kind for kind in described.pop("anyOf", []) if kind.get("type") != "null"]
        described.pop("default", None)
        schema["properties"][name] = (kinds[0] if kinds else {}) | described
    schema["properties"]["file"] |= {"format": "binary"}
    return schema


def public_id(file_id: int) -> str:
    return f"file-{file_id}"


def row_id(public: str) -> int:
    """`file-12` (or `12`) -> 12 (FILE_ID_PATTERN or FILE_CURSOR_PATTERN was checked)."""
    return int(public.removeprefix("file-"))
