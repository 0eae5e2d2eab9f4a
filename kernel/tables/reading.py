"""Reading an uploaded table (JSONL, CSV or Parquet) in Arrow batches within its bounds
(bounds.py), for the API's inspection and the worker's check alike, and that check: the
whole file read in a confined child before a job reads it (confined.py).

Every CSV column is text, as the workers read it. A Parquet file is read a page at a time
(not a row group at a time), in batches of about BATCH_BYTES by its metadata, so a large
row group or wide rows keep the reader small.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import lru_cache
from pathlib import Path
from typing import TypeVar

import pyarrow
import pyarrow.csv
import pyarrow.json
import pyarrow.parquet

from kernel.errors import FileUnreadable
from kernel.tables.bounds import MIB, TableLimits, check_parquet, check_text, checked
from kernel.tables.confined import run_confined

T = TypeVar("T")
Batches = tuple[pyarrow.Schema, Iterator[pyarrow.RecordBatch]]

BLOCK_BYTES = (MIB, 64 * MIB)
"""Arrow's text readers take a file a block at a time and hold some dozens of blocks at
once: small blocks keep a large upload's check within ~100 MB; a row longer than a block
needs the larger one (tried once the small one fails)."""
BATCH_BYTES = 64 * MIB
MOST_BATCH_ROWS = 65_536
PARQUET_BUFFER_BYTES = MIB


def read_table_file(path: Path, kind: str, limits: TableLimits, use: Callable[[Batches], T]) -> T:
    """`use` of the file's schema and checked batches, once its bounds are checked; a row
    longer than the first block is read again with the larger one. Arrow's errors pass."""
    if kind != "parquet":
        check_text(path, limits, json=kind == "jsonl")
    small, large = BLOCK_BYTES
    try:
        return use(open_batches(path, kind, limits, small))
    except pyarrow.ArrowInvalid as error:
        if "straddl" not in str(error):  # Arrow: a row straddles two blocks
            raise
    return use(open_batches(path, kind, limits, large))


def open_batches(path: Path, kind: str, limits: TableLimits, block: int) -> Batches:
    if kind == "parquet":
        parquet = pyarrow.parquet.ParquetFile(
            path, buffer_size=PARQUET_BUFFER_BYTES, pre_buffer=False
        )
        check_parquet(parquet.metadata, limits)
        batches = parquet.iter_batches(batch_size=batch_rows(parquet.metadata))
        return parquet.schema_arrow, checked(batches, limits)
    if kind == "csv":
        read = pyarrow.csv.ReadOptions(block_size=block)
        names = pyarrow.csv.open_csv(path, read_options=read).schema.names
        text = pyarrow.csv.ConvertOptions(column_types=dict.fromkeys(names, pyarrow.string()))
        reader = pyarrow.csv.open_csv(path, read_options=read, convert_options=text)
    else:
        reader = pyarrow.json.open_json(
            path, read_options=pyarrow.json.ReadOptions(block_size=block)
        )
    return reader.schema, checked(iter(reader), limits)


def batch_rows(metadata: pyarrow.parquet.FileMetaData) -> int:
    """Rows a batch of about BATCH_BYTES holds, by the widest row group's rows."""
    widest = max(
        (
            metadata.row_group(index).total_byte_size / metadata.row_group(index).num_rows
            for index in range(metadata.num_row_groups)
            if metadata.row_group(index).num_rows
        ),
        default=1.0,
    )
    return max(1, min(MOST_BATCH_ROWS, int(BATCH_BYTES / max(widest, 1.0))))


def read_through(batches: Batches) -> None:
    for _ in batches[1]:
        pass


def read_whole(path: Path, kind: str, limits: TableLimits) -> None:
    read_table_file(path, kind, limits, read_through)


def check_table(path: Path, kind: str, limits: TableLimits) -> None:
    """Reads the table whole in a confined child: FileTooComplex past a bound,
    FileUnreadable when it does not parse, crashes or takes more than the child may. Once
    a process for each file (a job opens its file up to three times, a sweep's trials more):
    a file replaced is another inode."""
    status = path.stat()
    check_once(path, kind, limits, status.st_ino, status.st_size)


@lru_cache(maxsize=256)
def check_once(path: Path, kind: str, limits: TableLimits, inode: int, size: int) -> None:
    try:
        confined_read(read_whole, path, kind, limits)
    except (pyarrow.ArrowException, OSError) as error:
        raise FileUnreadable(parse_failure(kind, error)) from None


def confined_read(
    function: Callable[..., T], path: Path, kind: str, limits: TableLimits, *args: object
) -> T:
    """function(path, kind, *args, limits) in a child with the memory and CPU `limits`
    give a file of this size."""
    size = path.stat().st_size
    return run_confined(
        function,
        (path, kind, *args, limits),
        memory_bytes=limits.memory_bytes(size),
        cpu_seconds=limits.cpu_seconds(size),
    )


def parse_failure(kind: str, error: Exception) -> str:
    """What a refusal says of a file Arrow could not parse as `kind`."""
    text = str(error).strip()
    first = text.splitlines()[0] if text else type(error).__name__
    return f"the file does not parse as {kind}: {first}"
