"""The bounds an uploaded table keeps (nesting depth, longest line and value, size unpacked),
checked before and while it is read, and the confined child that reads it: a crash, an
allocation past its memory or a loop past its CPU there is a FileUnreadable, never the
caller's end; the worker's check of a file reads it there once per file."""

from __future__ import annotations

import ctypes
from pathlib import Path

import pyarrow
import pyarrow.parquet
import pytest

from kernel.errors import FileTooComplex, FileUnreadable
from kernel.tables import bounds
from kernel.tables.bounds import TableLimits, check_parquet, check_text
from kernel.tables.confined import run_confined
from kernel.tables.reading import check_table, read_whole
from tests.hostile_uploads import deep_jsonl, dictionary_bomb, good_parquet

SMALL = TableLimits(row_bytes=1000, depth=8)


def nested(levels: int) -> str:
    return '{"question": "a", "x": ' + "[{" * (levels // 2) + "}]" * (levels // 2) + "}"


def write(path: Path, text: str | bytes) -> Path:
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return path


@pytest.mark.parametrize("chunk", [bounds.SCAN_CHUNK, 7])
def test_a_line_nested_past_the_depth_is_refused_by_its_number(
    tmp_path: Path, monkeypatch, chunk: int
) -> None:
    monkeypatch.setattr(bounds, "SCAN_CHUNK", chunk)
    deepest_allowed = nested(SMALL.depth - 1)  # the row's own object is a level
    path = write(tmp_path / "t.jsonl", f"{deepest_allowed}\n{deepest_allowed}\n")
    check_text(path, SMALL, json=True)
    write(path, f"{deepest_allowed}\n{{}}\n{nested(SMALL.depth + 1)}")
    with pytest.raises(FileTooComplex, match="line 3 nests objects or lists more than 8"):
        check_text(path, SMALL, json=True)


def test_brackets_in_strings_and_after_escapes_are_not_nesting(tmp_path: Path) -> None:
    text = '{"question": "' + "[{" * 50 + '\\" ' + "[" * 50 + '", "b": "\\\\"}\n'
    check_text(write(tmp_path / "t.jsonl", text), SMALL, json=True)
    escaped_quote_then_nesting = '{"q": "\\\\", "x": ' + "[" * 20 + "]" * 20 + "}\n"
    with pytest.raises(FileTooComplex, match="line 1"):
        check_text(write(tmp_path / "t.jsonl", escaped_quote_then_nesting), SMALL, json=True)


def test_a_csv_is_not_checked_for_nesting(tmp_path: Path) -> None:
    check_text(write(tmp_path / "t.csv", "question\n" + "[" * 100 + "\n"), SMALL, json=False)


@pytest.mark.parametrize("chunk", [bounds.SCAN_CHUNK, 64])
@pytest.mark.parametrize("ending", ["\n", ""])
def test_a_line_longer_than_the_row_limit_is_refused_by_its_number(
    tmp_path: Path, monkeypatch, chunk: int, ending: str
) -> None:
    monkeypatch.setattr(bounds, "SCAN_CHUNK", chunk)
    longest = "q" * SMALL.row_bytes
    path = write(tmp_path / "t.csv", f"question\n{longest}\n{longest}{ending}")
    check_text(path, SMALL, json=False)
    write(path, f"question\n{longest}\nq{longest}{ending}")
    with pytest.raises(FileTooComplex, match="line 3 is longer than 1000 bytes"):
        check_text(path, SMALL, json=False)


def parquet_file(path: Path, table: pyarrow.Table, **options: object) -> Path:
    pyarrow.parquet.write_table(table, path, **options)
    return path


def test_parquet_metadata_past_the_unpacked_limit_is_refused(tmp_path: Path) -> None:
    questions = [f"{i}{'q' * 100}" for i in range(100)]
    path = parquet_file(tmp_path / "t.parquet", pyarrow.table({"question": questions}))
    metadata = pyarrow.parquet.read_metadata(path)
    check_parquet(metadata, TableLimits(unpacked_bytes=metadata.row_group(0).total_byte_size))
    with pytest.raises(FileTooComplex, match=r"unpacks to \d+ bytes \(its metadata says\)"):
        check_parquet(metadata, TableLimits(unpacked_bytes=1000))


def test_a_long_parquet_value_is_refused_by_its_row_and_column(tmp_path: Path) -> None:
    table = pyarrow.table({"n": [1, 2, 3], "question": ["a", "b", "q" * 1001]})
    path = parquet_file(tmp_path / "t.parquet", table, use_dictionary=False)
    with pytest.raises(FileTooComplex, match="row 3 of column 'question' holds a value of"):
        read_whole(path, "parquet", SMALL)
    categories = pyarrow.array(["a", "q" * 1001, "a"]).dictionary_encode()
    path = parquet_file(tmp_path / "t.parquet", pyarrow.table({"question": categories}))
    with pytest.raises(FileTooComplex, match=r"^column 'question' holds a value of 1001 bytes"):
        read_whole(path, "parquet", SMALL)


def test_rows_that_unpack_past_the_limit_are_refused_whatever_the_metadata_says(
    tmp_path: Path,
) -> None:
    repeated = pyarrow.DictionaryArray.from_arrays(
        pyarrow.array([0] * 2000, pyarrow.int32()), pyarrow.array(["q" * 900])
    )
    table = pyarrow.table({"question": repeated})
    path = parquet_file(tmp_path / "t.parquet", table, store_schema=False)  # read as text
    limits = TableLimits(unpacked_bytes=100_000)
    check_parquet(pyarrow.parquet.read_metadata(path), limits)  # it says a few KB
    with pytest.raises(FileTooComplex, match="first 2000 rows unpack to 2 MiB, more than"):
        read_whole(path, "parquet", limits)


def crash() -> None:
    ctypes.string_at(0)


def allocate(size: int) -> int:
    return len(bytearray(size))


def spin() -> None:
    while True:
        pass


def refuse() -> None:
    raise FileTooComplex("too deep")


def test_a_crash_in_the_child_is_a_refusal_and_the_caller_lives() -> None:
    with pytest.raises(FileUnreadable, match=r"crashed its reader \(SIGSEGV\)"):
        run_confined(crash, (), memory_bytes=1 << 30, cpu_seconds=60)
    assert run_confined(allocate, (10,), memory_bytes=1 << 30, cpu_seconds=60) == 10


def test_memory_past_the_childs_limit_is_a_refusal() -> None:
    assert run_confined(allocate, (32 << 20,), memory_bytes=256 << 20, cpu_seconds=60) == 32 << 20
    with pytest.raises(FileUnreadable, match="needed more than 256 MiB of memory"):
        run_confined(allocate, (512 << 20,), memory_bytes=256 << 20, cpu_seconds=60)


def test_a_loop_past_the_childs_cpu_is_a_refusal() -> None:
    with pytest.raises(FileUnreadable, match="took more than"):
        run_confined(spin, (), memory_bytes=1 << 30, cpu_seconds=1)


def test_what_the_child_raises_is_raised_in_the_caller() -> None:
    with pytest.raises(FileTooComplex, match="too deep") as raised:
        run_confined(refuse, (), memory_bytes=1 << 30, cpu_seconds=60)
    assert raised.value.code == "file_too_complex"


def test_the_workers_check_refuses_what_no_reader_survives(tmp_path: Path) -> None:
    good = write(tmp_path / "good.parquet", good_parquet())
    check_table(good, "parquet", TableLimits())
    with pytest.raises(FileTooComplex, match="line 1 nests"):
        check_table(write(tmp_path / "deep.jsonl", deep_jsonl()), "jsonl", TableLimits())
    with pytest.raises(FileUnreadable, match="needed more than"):
        check_table(write(tmp_path / "bomb.parquet", dictionary_bomb()), "parquet", TableLimits())
    with pytest.raises(FileUnreadable, match="does not parse as parquet"):
        check_table(write(tmp_path / "cut.parquet", good_parquet()[:-30]), "parquet", TableLimits())


def test_the_workers_check_reads_a_file_once_and_a_replaced_file_again(tmp_path: Path) -> None:
    path = write(tmp_path / "t.parquet", good_parquet())
    check_table(path, "parquet", SMALL)
    broken = good_parquet()[:-30] + b"\0" * 30
    write(path, broken)  # in place, the same size: not read again
    check_table(path, "parquet", SMALL)
    write(tmp_path / "new.parquet", broken).replace(path)
    with pytest.raises(FileUnreadable, match="does not parse"):
        check_table(path, "parquet", SMALL)
