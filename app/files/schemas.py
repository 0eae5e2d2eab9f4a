"""The public bodies of the Files API."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, Field

from app.core.pages import Page

FILE_ID_PATTERN = r"^file-[1-9][0-9]{0,9}$"


class FileFormat(StrEnum):
    jsonl = "jsonl"
    parquet = "parquet"
    csv = "csv"


class FileColumn(BaseModel):
    name: str
    type: str = Field(description="Its Arrow type, e.g. `string`, `int64`.")


class FileReport(BaseModel):
    """What the upload found: the shape, the fields a dataset reads, and a few rows."""

    rows: int
    columns: list[FileColumn]
    question_field: str = Field(description="The column of questions, given or guessed.")
    answer_field: str | None = Field(
        description="The column of reference answers (for eval), given or guessed; null = none."
    )
    empty_questions: int = Field(description="Rows whose question is null or blank (skipped).")
    duplicate_questions: int = Field(description="Rows whose question an earlier row has.")
    preview: list[dict[str, Any]] = Field(description="The first rows, long values cut short.")


class FilePublic(BaseModel):
    id: str = Field(description="`file-<n>`: what a spec names (`dataset.file`).")
    filename: str
    format: FileFormat
    bytes: int
    sha256: str = Field(description="Of its bytes; the same bytes are stored once.")
    rows: int
    question_field: str
    answer_field: str | None
    created_at: datetime


class FileDetail(FilePublic):
    report: FileReport


class FilesPage(Page[FilePublic]):
    pass


def public_id(file_id: int) -> str:
    return f"file-{file_id}"


def row_id(public: str) -> int:
    """`file-12` -> 12 (the pattern FILE_ID_PATTERN was checked already)."""
    return int(public.removeprefix("file-"))
