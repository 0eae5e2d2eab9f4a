"""Reading an uploaded file once, in batches, to decide whether it can serve as a dataset
(report.py) and to write its report. An upload is inspected in a confined child
(`inspect_upload`): a file that crashes its reader, or unpacks out of proportion, is a 422
and never the API's end (kernel/tables). Blocking: it reads the whole file.

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

from app.files.errors import FileRefused
from app.files.report import (
    PREVIEW_ROWS,
    QuestionTally,
    answer_field,
    preview,
    question_field,
    unusable,
)
from app.files.schemas import FileColumn, FileFormat, FileReport
from kernel.errors import FileTooComplex, FileUnreadable
from kernel.tables.bounds import TableLimits
from kernel.tables.reading import Batches, confined_read, parse_failure, read_table_file

CHUNK = 1 << 20
DEFAULT_LIMITS = TableLimits()


def inspect_upload(
    path: Path, kind: FileFormat, field: str | None, answers: str | None, limits: TableLimits
) -> FileReport:
    """`inspect_file` in a confined child: what the file does to its reader there, a crash
    included, is a FileRefused (422)."""
    try:
        return confined_read(inspect_file, path, kind, limits, field, answers)
    except (FileTooComplex, FileUnreadable) as refused:
        raise FileRefused(422, refused.code, str(refused)) from None


def inspect_file(
    path: Path,
    kind: FileFormat,
    field: str | None,
    answers: str | None,
    limits: TableLimits = DEFAULT_LIMITS,
) -> FileReport:
    """The report of the file at `path`; FileRefused (422) saying why it cannot be a dataset,
    FileTooComplex past one of `limits`."""
    if kind is not FileFormat.parquet:
        check_utf8(path)
    try:
        return read_table_file(
            path, kind.value, limits, partial(report_of, field=field, answers=answers)
        )
    except MemoryError:  # Arrow's too: the confined child's to answer, not a parse error
        raise
    except (pyarrow.ArrowException, OSError) as error:
        raise unusable(parse_failure(kind.value, error)) from None


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
