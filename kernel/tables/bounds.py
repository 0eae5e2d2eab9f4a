"""The bounds an uploaded table keeps before and while it is read, so that no file can make
a reader crash or take memory out of proportion to its size.

Before reading: a JSONL line nested deeper than `depth` (Arrow's JSON parser recurses, and
a line 100,000 levels deep overflows its stack) or a JSONL/CSV line longer than
`row_bytes` is refused, from a streaming scan; a Parquet file whose metadata says it
unpacks to more than `unpacked_bytes` is refused from its footer. While reading: the
batches' data, as Arrow holds it, may not pass `unpacked_bytes`, nor a text value
`row_bytes` (a Parquet column's metadata can understate both: a dictionary holds one long
value that every row repeats). What lies past all of this is the confined reader's to catch
(confined.py).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow
import pyarrow.compute
import pyarrow.parquet

from kernel.errors import FileTooComplex, FileUnreadable

MIB = 1 << 20
GIB = 1 << 30
DEFAULT_MAX_UPLOAD_BYTES = GIB
UNPACKED_PER_UPLOADED_BYTE = 4
"""A text file of the largest size unpacks to about as much in Arrow, up to four times
for the smallest values (each string has a 4-byte offset, each number 8 bytes)."""
SCAN_CHUNK = MIB

ESCAPED = re.compile(rb"\\.")
KEPT = b'"[]{}\n'
OTHER_BYTES = bytes(byte for byte in range(256) if byte not in KEPT)
STRING = re.compile(rb'"[^"\n]*"')
EMPTY_CONTAINER = re.compile(rb"\[\]|\{\}")


@dataclass(frozen=True)
class TableLimits:
    """What one uploaded table may hold, and what its confined reader may take."""

    unpacked_bytes: int = UNPACKED_PER_UPLOADED_BYTE * DEFAULT_MAX_UPLOAD_BYTES
    row_bytes: int = 16 * MIB
    """The longest JSONL/CSV line, and the longest text value of any format."""
    depth: int = 64
    """How deep a JSONL line may nest objects and lists."""
    least_memory_bytes: int = GIB
    memory_per_file_byte: int = 4
    """The confined reader may add least_memory_bytes and this many bytes a byte of the
    file to the address space it starts with (the report keeps a digest of each question)."""
    least_cpu_seconds: int = 60
    cpu_seconds_per_gib: int = 240

    @classmethod
    def for_uploads(cls, max_upload_bytes: int) -> TableLimits:
        """The limits that go with OPD_MAX_UPLOAD_BYTES."""
        return cls(unpacked_bytes=UNPACKED_PER_UPLOADED_BYTE * max_upload_bytes)

    def memory_bytes(self, file_bytes: int) -> int:
        """The address space reading a file of `file_bytes` may add."""
        return self.least_memory_bytes + self.memory_per_file_byte * file_bytes

    def cpu_seconds(self, file_bytes: int) -> int:
        """The CPU time reading a file of `file_bytes` may take."""
        return max(self.least_cpu_seconds, math.ceil(self.cpu_seconds_per_gib * file_bytes / GIB))


def size_words(size: int) -> str:
    return f"{size / MIB:.0f} MiB" if size >= MIB else f"{size} bytes"


def check_text(path: Path, limits: TableLimits, *, json: bool) -> None:
    """Refuses a text file with a line longer than `row_bytes` or (`json`) nested deeper
    than `depth`, naming the line; reads it once, a chunk at a time."""
    line, carry = 1, b""
    with path.open("rb") as source:
        while chunk := source.read(SCAN_CHUNK):
            data = carry + chunk
            end = data.rfind(b"\n") + 1
            whole, carry = data[:end], data[end:]
            check_lines(whole, line, limits, json)
            line += whole.count(b"\n")
            if len(carry) > limits.row_bytes:
                raise too_long(line, limits)
    check_lines(carry, line, limits, json)


def check_lines(lines: bytes, first: int, limits: TableLimits, json: bool) -> None:
    """The checks of `lines`, whole lines whose first is line `first` of the file."""
    long = first_longer(lines, limits.row_bytes)
    if long is not None:
        raise too_long(first + long, limits)
    deep = too_deep_at(lines, limits.depth) if json else None
    if deep is not None:
        raise FileTooComplex(
            f"line {first + deep} nests objects or lists more than {limits.depth} levels "
            "deep, more than a dataset's rows need: flatten its nested fields"
        )


def first_longer(lines: bytes, most: int) -> int | None:
    """The index of the first of `lines` longer than `most` bytes, else None."""
    if len(lines) <= most:
        return None
    return next((i for i, text in enumerate(lines.split(b"\n")) if len(text) > most), None)


def too_long(line: int, limits: TableLimits) -> FileTooComplex:
    return FileTooComplex(
        f"line {line} is longer than {size_words(limits.row_bytes)}, the longest row this "
        "service reads: shorten or drop its long values"
    )


def too_deep_at(lines: bytes, depth: int) -> int | None:
    """The index of the first of `lines` nested deeper than `depth`, else None. Strings
    are set aside (escapes first), then the empty containers are removed `depth` times:
    each pass takes one level off every line, so a container left is one level too many."""
    if b"\\" in lines:
        lines = ESCAPED.sub(b"", lines)
    shape = STRING.sub(b"", lines.translate(None, OTHER_BYTES))
    for _ in range(depth):
        shape, removed = EMPTY_CONTAINER.subn(b"", shape)
        if not removed:
            return None
    left = EMPTY_CONTAINER.search(shape)
    return None if left is None else shape.count(b"\n", 0, left.start())


def check_parquet(metadata: pyarrow.parquet.FileMetaData, limits: TableLimits) -> None:
    """Refuses a Parquet file whose metadata says it unpacks past `unpacked_bytes`."""
    unpacked = sum(
        metadata.row_group(index).total_byte_size for index in range(metadata.num_row_groups)
    )
    if unpacked > limits.unpacked_bytes:
        raise too_large_unpacked(
            f"the file unpacks to {size_words(unpacked)} (its metadata says)", limits
        )


def too_large_unpacked(what: str, limits: TableLimits) -> FileTooComplex:
    return FileTooComplex(
        f"{what}, more than the {size_words(limits.unpacked_bytes)} this service reads of "
        f"one table ({UNPACKED_PER_UPLOADED_BYTE} × OPD_MAX_UPLOAD_BYTES): upload a part of it"
    )


def checked(
    batches: Iterator[pyarrow.RecordBatch], limits: TableLimits
) -> Iterator[pyarrow.RecordBatch]:
    """The batches, each checked as it comes: their data, in all, within `unpacked_bytes`,
    and each text value within `row_bytes`. A column read as a dictionary counts its
    indices (its values, stored once in the file, are within the metadata's size)."""
    unpacked, rows = 0, 0
    for batch in batches:
        for name, column in zip(batch.schema.names, batch.columns, strict=True):
            if pyarrow.types.is_dictionary(column.type):
                unpacked += column.indices.nbytes
                check_values(name, column.dictionary, None, limits)
            else:
                unpacked += column.nbytes
                check_values(name, column, rows, limits)
        rows += batch.num_rows
        if unpacked > limits.unpacked_bytes:
            what = f"the file's first {rows} rows unpack to {size_words(unpacked)}"
            raise too_large_unpacked(what, limits)
        yield batch


def check_values(
    name: str, values: pyarrow.Array, first_row: int | None, limits: TableLimits
) -> None:
    """Refuses text that is not UTF-8 (Parquet's is not checked as it is read) and a value
    longer than `row_bytes`, naming its row (`first_row` is the first value's; None: a
    dictionary's values, which are no row's)."""
    kind = values.type
    text = pyarrow.types.is_string(kind) or pyarrow.types.is_large_string(kind)
    if not (text or pyarrow.types.is_binary(kind) or pyarrow.types.is_large_binary(kind)):
        return
    if text:
        try:
            values.validate(full=True)
        except pyarrow.ArrowInvalid:
            raise FileUnreadable(
                f"column {name!r} holds text that is not UTF-8: save it as UTF-8"
            ) from None
    lengths = pyarrow.compute.binary_length(values)
    longest = pyarrow.compute.max(lengths).as_py()
    if longest is not None and longest > limits.row_bytes:
        where = f"column {name!r}"
        if first_row is not None:
            where = (
                f"row {first_row + pyarrow.compute.index(lengths, longest).as_py() + 1} of {where}"
            )
        raise FileTooComplex(
            f"{where} holds a value of {size_words(longest)}, longer than the "
            f"{size_words(limits.row_bytes)} this service reads: shorten or drop its long values"
        )
