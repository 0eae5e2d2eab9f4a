"""inspect_file on files the tests write: JSONL and CSV rows longer than the reader's
first block are read (with the larger one), and the UTF-8 check names where a file breaks
even when a character is split across the check's chunks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.files import inspection
from app.files.errors import FileRefused
from app.files.inspection import check_utf8, inspect_file
from app.files.schemas import FileFormat

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
