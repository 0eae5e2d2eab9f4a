"""Where a job's dataset file lives, and the rule that the service reads only under its data
root (OPD_DATA_ROOT): no `..` or absolute path that leaves it, no symlink that points out.

The API checks this when a job is submitted, so a bad path is refused before it is stored;
the worker checks again when it opens the file, since a symlink may have changed since.
"""

from __future__ import annotations

from pathlib import Path


class DataPathError(ValueError):
    """A dataset path the service will not read; the message says what to do instead."""


def resolve_data_path(path: str, data_root: Path) -> Path:
    """The real location of `path`, taken relative to the data root unless absolute, with
    every symlink and `..` followed."""
    try:
        return (data_root.resolve() / path).resolve()
    except ValueError as error:  # a NUL byte
        raise DataPathError(f"dataset path {path!r} cannot be used: {error}") from error
    except (OSError, RuntimeError):  # symlink loops: their message names where they lead
        raise DataPathError(f"dataset path {path!r} cannot be used") from None


def confine_data_path(path: str, data_root: Path) -> Path:
    """`resolve_data_path`, refusing a location outside the data root."""
    resolved = resolve_data_path(path, data_root)
    if not resolved.is_relative_to(data_root.resolve()):
        raise DataPathError(
            f"dataset path {path!r} points outside the server's data root; "
            "upload the file into the data root and give its path relative to it"
        )
    return resolved
