"""inspect_file on files the tests write: JSONL and CSV rows longer than the reader's
first block are read (with the larger one), and the UTF-8 check names where a file breaks
even when a character is split across the check's chunks. inspect_upload, in its confined
child: a line that crashed the reader and a Parquet bomb are 422s the process survives
holding nothing; a good file's report, and a refusal, come back as they are in-process."""

from __future__ import annotations

import json
import resource
from pathlib import Path

import pytest

from app.files import inspection
from app.files.errors import FileRefused
from app.files.inspection import check_utf8, inspect_file, inspect_upload
from app.files.schemas import FileFormat
from kernel.tables.bounds import TableLimits
from tests.hostile_uploads import deep_jsonl, dictionary_bomb, good_jsonl, good_parquet

LONG = "q" * (3 << 20)


def test_a_jsonl_row_longer_than_the_first_block_is_read(tmp_path: Path) -> None:
    path = tmp_path / "long.jsonl"
    path.write_text(json.dumps({"question": LONG}) + "\n" + json.dumps({"question": "b"}) + "\n")
    report = inspect_file(path, FileFormat.jsonl, None, None)
    assert report.rows == 2 and report.preview[0]["question"].endswith("…")


def test_a_csv_row_longer_than_the_first_block_is_read(tmp_path: Path) -> None:
    path = tmp_path / "long.csv"
    path.write_text(f"question,answer\n{LONG},1\nb,2\n")
    report = inspect_file(path, FileFormat.csv, None, None)
    assert (report.rows, report.answer_field) == (2, "answer")


def test_utf8_breaks_are_found_across_chunks(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(inspection, "CHUNK", 4)
    path = tmp_path / "t.jsonl"
    path.write_bytes("ab\nc\u00e9\n".encode() + b"x\n\xff\n")  # é split over two chunks
    with pytest.raises(FileRefused, match=r"byte 9 \(line 4\)") as refused:
        check_utf8(path)
    assert refused.value.code == "not_utf8"
    path.write_bytes("ab\nc\u00e9\n".encode())
    check_utf8(path)


def test_a_line_nested_100000_levels_deep_is_a_422_not_a_crash(tmp_path: Path) -> None:
    path = tmp_path / "deep.jsonl"
    path.write_bytes(deep_jsonl())
    with pytest.raises(FileRefused) as refused:
        inspect_upload(path, FileFormat.jsonl, None, None, TableLimits())
    assert (refused.value.status, refused.value.code) == (422, "file_too_complex")
    assert "line 1 nests objects or lists more than 64 levels deep" in refused.value.message


def test_a_parquet_bomb_is_a_422_and_the_inspecting_process_holds_none_of_it(
    tmp_path: Path,
) -> None:
    path = tmp_path / "bomb.parquet"
    path.write_bytes(dictionary_bomb())
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    with pytest.raises(FileRefused) as refused:
        inspect_upload(path, FileFormat.parquet, None, None, TableLimits())
    assert (refused.value.status, refused.value.code) == (422, "file_unreadable")
    assert "needed more than 1024 MiB of memory" in refused.value.message
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before < 256 << 20


@pytest.mark.parametrize(
    ("name", "data"),
    [
        ("t.jsonl", good_jsonl()),
        ("t.parquet", good_parquet()),
        ("t.csv", b"prompt,answer\n" + b"".join(b"q%d,%d\n" % (i, i) for i in range(50))),
    ],
)
def test_a_good_files_report_is_the_same_from_the_confined_child(
    tmp_path: Path, name: str, data: bytes
) -> None:
    path = tmp_path / name
    path.write_bytes(data)
    kind = FileFormat(name.split(".")[1])
    report = inspect_upload(path, kind, None, None, TableLimits())
    assert report == inspect_file(path, kind, None, None) and report.rows in (50, 200)


def test_a_refusal_in_the_confined_child_comes_back_whole(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"question": "a"}) + "\n")
    with pytest.raises(FileRefused) as refused:
        inspect_upload(path, FileFormat.jsonl, "prompt", None, TableLimits())
    assert refused.value == FileRefused(
        422,
        "unusable_file",
        "the file has no column 'prompt'; its columns: question (string)",
        "field",
    )
