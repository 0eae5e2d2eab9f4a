"""Secrets an installation makes for itself when none is configured, kept in files under
OPD_HOME: made once, whole or not at all and readable by their owner only, so that every
process sharing the home (and every restart) uses the same one."""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable
from pathlib import Path


def home_secret(path: Path, make: Callable[[], str]) -> str:
    """The secret kept at `path`, made with `make` the first time it is asked for."""
    if not path.is_file():
        write_once(path, make())
    return path.read_text().strip()


def write_once(path: Path, text: str) -> None:
    """Create `path` holding `text`, readable by its owner only, unless it already exists:
    the file appears whole (a hard link of a finished temporary file) or not at all."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text + "\n")
    try:
        os.link(temporary, path)
    except FileExistsError:
        pass
    finally:
        temporary.unlink()
