"""What the files feature refuses, each its own answer at the doors."""

from __future__ import annotations

from dataclasses import dataclass


class FileNotFound(LookupError):
    """No such file (or one of another team: the answer is the same)."""


@dataclass
class FileRefused(Exception):
    """An upload that cannot serve as a dataset, or goes past a limit; nothing was kept.
    `status` is the HTTP status the API answers with (413 too large, 422 unusable)."""

    status: int
    code: str
    message: str
    param: str | None = None

    def __str__(self) -> str:
        return self.message

    def __reduce__(self) -> tuple[type[FileRefused], tuple[int, str, str, str | None]]:
        # Raised in the confined child that inspects an upload, and pickled back.
        return (FileRefused, (self.status, self.code, self.message, self.param))


class FileInUse(Exception):
    """A file that an unfinished job reads cannot be deleted; the message names the jobs."""
