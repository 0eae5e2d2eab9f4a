"""Where a job's dataset file lives, and the rule that the service reads only under its data
root (OPD_DATA_ROOT): no `..` or absolute path that leaves it, no symlink that points out.

The API checks this when a job is submitted, so a bad path is refused before it is stored;
the worker checks again when it opens the file, since a symlink may have changed since.
A model is named by a folder or by a hub id, told apart by the name's shape alone
(`is_model_path`).
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


def is_model_path(model: str) -> bool:
    """Whether `model` names a folder rather than a hub id, by its shape alone: a hub id is
    `name` or `org/name`, so anything with `..`, a backslash, a leading `.`, `/` or `~`, or
    a second `/` is a path. Never by what exists: the answer would tell a team which folders
    the API's or a worker's directory holds, and a hub id is read from the hub cache only,
    never as a folder relative to the directory the process runs in."""
    return (
        model.startswith(("/", ".", "~")) or ".." in model or "\\" in model or model.count("/") > 1
    )
