"""Checkpoint archives: the same bytes for the same files, never a link's target, and a
fetched archive counts as kept only once complete with its SHA-256 beside it."""

from __future__ import annotations

import hashlib
import os
import tarfile

from app.jobs.archives import fetched, keep_fetched, write_archive


def test_an_archive_holds_the_folder_and_is_the_same_bytes_for_the_same_files(tmp_path):
    folder = tmp_path / "run"
    (folder / "sub").mkdir(parents=True)
    (folder / "weights.bin").write_bytes(b"\x01" * 1000)
    (folder / "sub" / "config.json").write_text("{}")
    (folder / "leak").symlink_to("/etc/hostname")

    first = write_archive(folder, tmp_path / "a.tar.gz")
    os.utime(folder / "weights.bin", (1, 1))  # a touched file, the same content
    second = write_archive(folder, tmp_path / "b.tar.gz")

    assert (
        first.sha256
        == second.sha256
        == hashlib.sha256((tmp_path / "a.tar.gz").read_bytes()).hexdigest()
    )
    with tarfile.open(tmp_path / "a.tar.gz") as tar:
        members = {member.name: member for member in tar}
        assert sorted(members) == ["run", "run/sub", "run/sub/config.json", "run/weights.bin"]
        assert {(m.mtime, m.uid, m.uname) for m in members.values()} == {(0, 0, "")}
        assert tar.extractfile("run/weights.bin").read() == b"\x01" * 1000


def test_a_fetched_archive_is_kept_only_once_complete(tmp_path):
    archive = tmp_path / "downloads" / "checkpoint-3.tar.gz"
    archive.parent.mkdir()
    partial = archive.with_name(archive.name + ".part")
    partial.write_bytes(b"half")
    assert fetched(archive) is None

    kept = keep_fetched(partial, archive)

    assert kept.sha256 == hashlib.sha256(b"half").hexdigest() and kept.size == 4
    assert fetched(archive) == kept and not partial.exists()
