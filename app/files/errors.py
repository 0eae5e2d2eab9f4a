"""What the files feature refuses, each its own answer at the doors."""

from __future__ import annotations

from dataclasses import astuple, dataclass
from typing import Any


class FileNotFound(LookupError):
    """No such file (or one of another team: the answer is the same)."""


@dataclass
class FileRefused(Exception):
    """An upload that cannot serve as a dataset, or goes past a limit; nothing was kept.
    `status` is the HTTP status the API answers with (413 too large, 422 unusable, 429 too
    many bytes arriving at once, with `retry_after` seconds)."""

    status: int
    code: str
    message: str
    param: str | None = None
    retry_after: int | None = None

    def __str__(self) -> str:
        return self.message

    def __reduce__(self) -> tuple[type[FileRefused], tuple[Any, ...]]:
        # Raised in the confined child that inspects an upload, and pickled back.
        return (FileRefused, astuple(self))


class FileInUse(Exception):
    """A file that an unfinished job reads cannot be deleted; the message names the jobs."""


def too_large(limit: int) -> FileRefused:
    return FileRefused(
        413, "file_too_large", f"the file is larger than this service's limit of {limit} bytes"
    )


def over_quota(used: int, quota: int) -> FileRefused:
    return FileRefused(
        413,
        "file_quota_exceeded",
        f"the team's files would hold more than its quota of {quota} bytes ({used} used or "
        "reserved by uploads under way); delete files it no longer needs "
        "(DELETE /v1/files/{id})",
    )
