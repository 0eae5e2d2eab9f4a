"""The model cache's rules, with a converter that writes a small folder (the real conversion,
of SmolLM2, is tested in test_smollm2.py): a GGUF is converted once, into a folder named by
its sha256; a conversion cut short is never used; two converters do not convert one file
twice; the file's digest is read once for each path, size and mtime."""

from __future__ import annotations

import fcntl
import hashlib
import os
import threading
from pathlib import Path

import pytest

from worker.engine.backends.local.gguf import converted, file_digest

CONTENT = b"GGUF pretend weights"


@pytest.fixture
def gguf(tmp_path: Path) -> Path:
    path = tmp_path / "data" / "model.Q4_1.gguf"
    path.parent.mkdir()
    path.write_bytes(CONTENT)
    return path


class Converter:
    """Writes a config and a weights file, as the real conversion does; counts its calls,
    and can fail halfway through the weights."""

    def __init__(self, fail: bool = False) -> None:
        self.calls: list[Path] = []
        self.fail = fail

    def __call__(self, gguf: Path, folder: Path) -> None:
        self.calls.append(folder)
        folder.mkdir()
        (folder / "config.json").write_text("{}")
        with (folder / "model.safetensors").open("wb") as weights:
            weights.write(b"half of the weights")
            if self.fail:
                raise MemoryError("killed halfway through the weights")
            weights.write(b" and the rest")


def test_a_gguf_is_converted_once_into_a_folder_named_by_its_sha256(gguf, tmp_path):
    cache, convert, notes = tmp_path / "cache", Converter(), []

    first = converted(gguf, cache, lambda *said: notes.append(said), convert)
    again = converted(gguf, cache, lambda *said: notes.append(said), convert)

    assert first == again == cache / f"gguf-{hashlib.sha256(CONTENT).hexdigest()}"
    assert len(convert.calls) == 1
    assert (first / "model.safetensors").read_bytes() == b"half of the weights and the rest"
    assert len(notes) == 2, notes
    assert notes[0][0].startswith("Converting model.Q4_1.gguf (0 MB) into a Hugging Face folder")
    assert notes[1][0].startswith("Converted model.Q4_1.gguf in ")
    assert str(tmp_path) not in repr(notes), "the team reads these: no folder of the workers'"
    assert not [p for p in cache.iterdir() if ".tmp-" in p.name]


def test_a_copy_of_the_same_file_elsewhere_uses_the_same_folder(gguf, tmp_path):
    cache, convert = tmp_path / "cache", Converter()
    copy = tmp_path / "elsewhere.gguf"
    copy.write_bytes(CONTENT)

    assert converted(gguf, cache, convert=convert) == converted(copy, cache, convert=convert)
    assert len(convert.calls) == 1


def test_a_conversion_cut_short_is_never_used_and_the_next_one_starts_afresh(gguf, tmp_path):
    cache = tmp_path / "cache"
    with pytest.raises(MemoryError):
        converted(gguf, cache, convert=Converter(fail=True))
    assert not list(cache.glob("gguf-*")), "no folder took the name"
    (cache / f".gguf-{file_digest(gguf, cache)}.tmp-dead").mkdir()  # a converter killed -9

    folder = converted(gguf, cache, convert=Converter())

    assert (folder / "model.safetensors").read_bytes() == b"half of the weights and the rest"
    assert not [p for p in cache.iterdir() if ".tmp-" in p.name]


def test_the_conversion_holds_the_files_lock(gguf, tmp_path):
    """While one converter writes, another (here: another open file, as in another process)
    cannot take the lock, so it waits instead of converting the same file again."""
    cache, held = tmp_path / "cache", []

    def convert(source: Path, folder: Path) -> None:
        (lock,) = cache.glob(".gguf-*.lock")
        with lock.open("a") as other:
            try:
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                held.append(True)
        Converter()(source, folder)

    converted(gguf, cache, convert=convert)

    assert held == [True]


def waiting_on(lock: Path) -> bool:
    """Whether a thread or process waits for the flock on `lock` (Linux: /proc/locks marks
    a waiter with `->`, and names the file by device and inode)."""
    inode = f":{lock.stat().st_ino} "
    return any("->" in line and inode in line for line in Path("/proc/locks").open())


def test_a_converter_that_waited_on_the_lock_uses_the_folder_made_meanwhile(gguf, tmp_path):
    cache, convert = tmp_path / "cache", Converter()
    digest = file_digest(gguf, cache)
    lock = cache / f".gguf-{digest}.lock"
    found: list[Path] = []
    with lock.open("a") as holder:
        fcntl.flock(holder, fcntl.LOCK_EX)  # another converter, at work
        waiting = threading.Thread(
            target=lambda: found.append(converted(gguf, cache, convert=convert))
        )
        waiting.start()
        while not waiting_on(lock):
            waiting.join(0.01)
        Converter()(gguf, cache / f"gguf-{digest}")  # ... which finishes
        fcntl.flock(holder, fcntl.LOCK_UN)
    waiting.join(60)

    assert found == [cache / f"gguf-{digest}"] and convert.calls == []


def test_the_digest_is_read_once_for_each_path_size_and_mtime(gguf, tmp_path):
    cache = tmp_path / "cache"
    digest = file_digest(gguf, cache)
    stat = gguf.stat()
    gguf.write_bytes(CONTENT.upper())  # same size; its old mtime put back below
    os.utime(gguf, ns=(stat.st_atime_ns, stat.st_mtime_ns))

    assert file_digest(gguf, cache) == digest, "not read again"
    os.utime(gguf, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert file_digest(gguf, cache) == hashlib.sha256(CONTENT.upper()).hexdigest()
