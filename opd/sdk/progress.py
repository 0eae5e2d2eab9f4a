"""A job's progress while `wait(progress=True)` polls it, and a file's while
`files.upload` sends it: a tqdm bar when tqdm is installed, else one line on stderr
rewritten in place."""

from __future__ import annotations

import sys
from typing import Any

from app.jobs.schemas import JobPublic


class Progress:
    def __init__(self, job: JobPublic) -> None:
        self.total = job.total_steps
        self.kl: float | None = None
        self.bar: Any = None
        try:
            from tqdm import tqdm
        except ImportError:
            return
        self.bar = tqdm(
            total=self.total,
            desc=f"job {job.id} {job.name}",
            unit="step",
            file=sys.stderr,
            dynamic_ncols=True,
        )

    def show(self, job: JobPublic, reverse_kl: float | None) -> None:
        self.kl = reverse_kl if reverse_kl is not None else self.kl
        done = min(self.total, job.steps_done)
        if self.bar is None:
            kl = "" if self.kl is None else f" reverse_kl={self.kl:.4f}"
            print(
                f"\rjob {job.id} {job.status}: {done}/{self.total} steps{kl}",
                end="",
                file=sys.stderr,
                flush=True,
            )
            return
        if self.kl is not None:
            self.bar.set_postfix(reverse_kl=f"{self.kl:.4f}", refresh=False)
        self.bar.set_description(f"job {job.id} {job.status}", refresh=False)
        self.bar.update(done - self.bar.n)

    def note(self, text: str) -> None:
        """A line above the bar (on stdout), which stays as the bar moves on."""
        if self.bar is None:
            print(file=sys.stderr, flush=True)
            print(text, flush=True)
        else:
            self.bar.write(text, file=sys.stdout)

    def close(self) -> None:
        close(self.bar)


class UploadProgress:
    """Bytes of one file sent so far (a retried upload starts the bar again)."""

    def __init__(self, name: str, total: int) -> None:
        self.name, self.total = name, total
        self.bar: Any = None
        try:
            from tqdm import tqdm
        except ImportError:
            return
        self.bar = tqdm(
            total=total,
            desc=f"uploading {name}",
            unit="B",
            unit_scale=True,
            unit_divisor=1024,
            file=sys.stderr,
            dynamic_ncols=True,
        )

    def sent(self, done: int) -> None:
        if self.bar is None:
            print(f"\ruploading {self.name}: {done}/{self.total} bytes", end="", file=sys.stderr)
            return
        self.bar.update(done - self.bar.n)

    def close(self) -> None:
        close(self.bar)


def close(bar: Any) -> None:
    """End a tqdm bar, or the line rewritten in place where tqdm is missing."""
    if bar is None:
        print(file=sys.stderr)
    else:
        bar.close()
