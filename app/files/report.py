"""Whether an uploaded table can serve as a dataset, and what its report says: which
columns hold the questions and the answers (given, else guessed from their names), how
many questions are empty or repeated, and a preview. Pure: the reading is inspection.py's.

A column qualifies only if it holds text, as the worker's reader requires
(worker/engine/data/datasets.py), so a file accepted here is one a job can read.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from app.files.errors import FileRefused
from app.files.schemas import QuestionBytes

QUESTION_NAMES = ("question", "prompt", "problem", "query", "instruction", "input")
ANSWER_NAMES = ("answer", "final_answer", "solution", "reference", "target", "output")
TEXT_TYPES = frozenset({"string", "large_string"})
PREVIEW_ROWS = 5
PREVIEW_CHARS = 300


def unusable(message: str, param: str | None = None) -> FileRefused:
    return FileRefused(422, "unusable_file", message, param)


def listed(columns: Mapping[str, str]) -> str:
    return ", ".join(f"{name} ({kind})" for name, kind in columns.items()) or "none"


def question_field(columns: Mapping[str, str], given: str | None) -> str:
    """The column of questions: the one given, else the first text column with a usual
    name, else the only text column."""
    if given is not None:
        if given not in columns:
            raise unusable(
                f"the file has no column {given!r}; its columns: {listed(columns)}", "field"
            )
        if columns[given] not in TEXT_TYPES:
            raise unusable(f"column {given!r} holds {columns[given]}, not text", "field")
        return given
    text = [name for name, kind in columns.items() if kind in TEXT_TYPES]
    for name in QUESTION_NAMES:
        if name in text:
            return name
    if len(text) == 1:
        return text[0]
    raise unusable(
        f"no question column: none of the text columns is named {', '.join(QUESTION_NAMES)}"
        f" (its columns: {listed(columns)}); name the column with `field`",
        "field",
    )


def answer_field(columns: Mapping[str, str], given: str | None, question: str) -> str | None:
    """The column of reference answers: the one given, else the first text column with a
    usual name other than the questions'; None when there is none."""
    if given is not None:
        if given not in columns:
            raise unusable(
                f"the file has no column {given!r}; its columns: {listed(columns)}",
                "answer_field",
            )
        if columns[given] not in TEXT_TYPES:
            raise unusable(f"column {given!r} holds {columns[given]}, not text", "answer_field")
        return given
    for name in ANSWER_NAMES:
        if name != question and columns.get(name) in TEXT_TYPES:
            return name
    return None


@dataclass
class QuestionTally:
    """Counts over the question column, read in batches: a digest of each question is
    kept, never the question."""

    rows: int = 0
    empty: int = 0
    duplicates: int = 0
    seen: set[bytes] = field(default_factory=set)
    lengths: list[int] = field(default_factory=lambda: [0, 0, 0])
    """The non-empty questions' bytes: the fewest, the total, the most."""

    def add(self, questions: Iterable[str | None]) -> None:
        for question in questions:
            self.rows += 1
            if question is None or not question.strip():
                self.empty += 1
                continue
            size = len(question.strip().encode())  # as a prompt is rendered
            fewest, total, most = self.lengths
            first = self.rows - self.empty == 1
            self.lengths = [size if first else min(fewest, size), total + size, max(most, size)]
            digest = hashlib.blake2b(question.encode(), digest_size=16).digest()
            if digest in self.seen:
                self.duplicates += 1
            else:
                self.seen.add(digest)

    def question_bytes(self) -> QuestionBytes:
        fewest, total, most = self.lengths
        return QuestionBytes(shortest=fewest, mean=total / (self.rows - self.empty), longest=most)

    def check(self, question: str) -> None:
        """A file without one usable question trains nothing: refused."""
        if self.rows == 0:
            raise unusable("the file has no rows")
        if self.empty == self.rows:
            raise unusable(f"every question in column {question!r} is empty", "field")


def preview_value(value: Any) -> Any:
    """A value as the preview shows it: JSON's own types, long text cut short."""
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= PREVIEW_CHARS else text[:PREVIEW_CHARS] + "…"


def preview(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    return [{key: preview_value(value) for key, value in row.items()} for row in rows]
