"""Checkpoint archives as people download them, each with its SHA-256.

A local checkpoint's folder is archived on request into a .tar.gz that is the same bytes
for the same files (entries sorted, no times or owners), so its SHA-256 names its content;
one in the bucket (`opd-store://...`) is first read into the API's own checkpoint cache,
each object checked against its hash, and archived under its name the same way.
A remote backend's archive is fetched by a worker once and kept beside the job's artifacts
(`job-<id>/downloads/`), its SHA-256 in a file next to it, written before the archive
takes its name: an archive under its name is complete.
"""

from __future__ import annotations

import gzip
import tarfile
from pathlib import Path

from kernel.playground import Archive
from kernel.storage.hashing import file_sha256

SHA256_HEADER = "X-Checkpoint-SHA256"


def normalized(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mode = 0o755 if info.isdir() else 0o644
    return info


def write_archive(folder: Path, out: Path, name: str | None = None) -> Archive:
    """`folder` (its files and folders; never a link) as `<name>/...` in a .tar.gz (the
    folder's own name by default)."""
    with (
        out.open("wb") as raw,
        gzip.GzipFile(filename="", fileobj=raw, mode="wb", mtime=0) as zipped,
        tarfile.open(fileobj=zipped, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        top = name or folder.name
        tar.add(folder, arcname=top, recursive=False, filter=normalized)
        for path in sorted(folder.rglob("*")):
            if path.is_symlink() or not (path.is_file() or path.is_dir()):
                continue
            arcname = f"{top}/{path.relative_to(folder).as_posix()}"
            tar.add(path, arcname=arcname, recursive=False, filter=normalized)
    return Archive(path=str(out), sha256=file_sha256(out), size=out.stat().st_size)


def fetched_path(artifact_root: Path, job_id: int, checkpoint_id: int) -> Path:
    """Where a worker keeps the archive it fetched of a remote checkpoint."""
    return artifact_root / f"job-{job_id}" / "downloads" / f"checkpoint-{checkpoint_id}.tar.gz"


def digest_path(archive: Path) -> Path:
    return archive.with_name(archive.name + ".sha256")


def fetched(archive: Path) -> Archive | None:
    """The archive kept at `archive`, if it is complete."""
    if not (archive.is_file() and digest_path(archive).is_file()):
        return None
    sha256 = digest_path(archive).read_text().strip()
    return Archive(path=str(archive), sha256=sha256, size=archive.stat().st_size)


def keep_fetched(partial: Path, archive: Path) -> Archive:
    """Give a fully downloaded `partial` its name `archive`, its SHA-256 beside it."""
    sha256 = file_sha256(partial)
    digest_path(archive).write_text(sha256 + "\n")
    partial.replace(archive)
    return Archive(path=str(archive), sha256=sha256, size=archive.stat().st_size)
