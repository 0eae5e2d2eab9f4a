"""Reading an uploaded file once, in batches, to decide whether it can serve as a dataset
(report.py) and to write its report. Runs in a thread: it reads the whole file.

Every CSV column is text, as the workers read it. JSONL and CSV must be UTF-8 (the
workers' reader decodes them so; Arrow's JSON reader would let broken bytes through),
checked incrementally first. Parquet is read by row
group, so a truncated file is refused by its missing footer.
"""

from __future__ import annotations

import codecs
from collections.abc import Iterator
from pathlib import Path

import pyarrow
import pyarrow.csv
import pyarrow.json
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
from app.files.schemas import FileColumn, FileFormat, FileReport

CHUNK = 1 << 20
BLOCK_BYTES = (1 << 20, 64 << 20)
"""Arrow's text readers take a file a block at a time and hold some dozens of blocks at
once: small blocks keep a large upload's check within ~100 MB; a row longer than a block
needs the larger one (tried once the small one fails)."""


def inspect_file(
    path: Path, kind: FileFormat, field: str | None, answers: str | None
) -> FileReport:
    """The report of the file at `path`; FileRefused (422) saying why it cannot be a dataset."""
    if kind is not FileFormat.parquet:
        check_utf8(path)
    small, large = BLOCK_BYTES
    try:
        return read_report(path, kind, field, answers, small)
    except FileRefused as refused:
        if "straddl" not in refused.message:  # Arrow: a row straddles two blocks
            raise
    return read_report(path, kind, field, answers, large)


def read_report(
    path: Path, kind: FileFormat, field: str | None, answers: str | None, block: int
) -> FileReport:
    try:
        schema, batches = open_batches(path, kind, block)
        columns = {name: str(schema.field(name).type) for name in schema.names}
        question = question_field(columns, field)
        answer = answer_field(columns, answers, question)
        tally, first = QuestionTally(), []
        for batch in batches:
            if len(first) < PREVIEW_ROWS:
                first.extend(batch.slice(0, PREVIEW_ROWS - len(first)).to_pylist())
            tally.add(batch.column(question).to_pylist())
    except (pyarrow.ArrowException, OSError) as error:
        raise unusable(f"the file does not parse as {kind.value}: {reason(error)}") from None
    tally.check(question)
    return FileReport(
        rows=tally.rows,
        columns=[FileColumn(name=name, type=arrow) for name, arrow in columns.items()],
        question_field=question,
        answer_field=answer,
        empty_questions=tally.empty,
        duplicate_questions=tally.duplicates,
        preview=preview(first),
    )


def reason(error: Exception) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


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


def open_batches(
    path: Path, kind: FileFormat, block: int
) -> tuple[pyarrow.Schema, Iterator[pyarrow.RecordBatch]]:
    if kind is FileFormat.parquet:
        parquet = pyarrow.parquet.ParquetFile(path)
        return parquet.schema_arrow, parquet.iter_batches()
    if kind is FileFormat.csv:
        read = pyarrow.csv.ReadOptions(block_size=block)
        names = pyarrow.csv.open_csv(path, read_options=read).schema.names
        text = pyarrow.csv.ConvertOptions(column_types=dict.fromkeys(names, pyarrow.string()))
        reader = pyarrow.csv.open_csv(path, read_options=read, convert_options=text)
    else:
        reader = pyarrow.json.open_json(
            path, read_options=pyarrow.json.ReadOptions(block_size=block)
        )
    return reader.schema, iter(reader)
