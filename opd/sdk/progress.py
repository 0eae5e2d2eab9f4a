"""A job's progress while `wait(progress=True)` polls it (kernel/progress.py's bars), and a
file's while `files.upload` sends it: tqdm bars on stderr."""

from __future__ import annotations

import sys

from tqdm import tqdm

from app.jobs.schemas import JobPublic
from kernel.metric_names import REVERSE_KL
from kernel.progress import ProgressBars


class Progress:
    """A job's bars while `wait` polls it: its steps with its reverse KL (by the metric's
    name) and the time left, evals included; its status and what it does now (why it
    waits, when queued); a held-out eval's prompts on a bar of their own."""

    def __init__(self, job: JobPublic) -> None:
        self.bars = ProgressBars(f"job {job.id} {job.name}", job.total_steps, sys.stderr)
        self.waiting: str | None = None

    def show(self, job: JobPublic, reverse_kl: float | None) -> None:
        if reverse_kl is not None:
            self.bars.figure(REVERSE_KL, f"{reverse_kl:.4f}")
        doing = job.progress.line() if job.progress else job.status
        if job.queue is not None and job.queue.position is not None:
            doing = f"queued (#{job.queue.position})"
        if job.queue_reason and job.queue_reason != self.waiting:
            self.bars.write(f"job {job.id} waits: {job.queue_reason}")
        self.waiting = job.queue_reason
        self.bars.show(job.progress)
        self.bars.steps(job.steps_done, f"job {job.id} {doing}")

    def note(self, text: str) -> None:
        """A line above the bar (on stdout), which stays as the bar moves on."""
        self.bars.write(text, sys.stdout)

    def close(self) -> None:
        self.bars.close()


class UploadProgress:
    """Bytes of one file sent so far (a retried upload starts the bar again)."""

    def __init__(self, name: str, total: int) -> None:
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
        self.bar.update(done - self.bar.n)

    def close(self) -> None:
        self.bar.close()
