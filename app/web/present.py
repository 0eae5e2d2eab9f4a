"""How the pages show numbers, times and specs (pure functions, tested alone)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from app.budgets.rules import BUDGET_STOP
from app.jobs.schemas import ACTIVE_STATUSES, TERMINAL_STATUSES, JobStatus
from kernel.progress import JobProgress
from kernel.summary import Change

LIVE_STATUSES = ACTIVE_STATUSES | {JobStatus.queued}
"""Rows in these statuses change by themselves, so the jobs table refreshes them."""


def number(value: float | None, missing: str = "–") -> str:
    """Four significant digits, which is what a person compares at a glance; `missing` for
    no value (the command line shows an ASCII `-`)."""
    if value is None or not math.isfinite(value):
        return missing
    return f"{value:.4g}"


def when(moment: datetime | None) -> str:
    return "" if moment is None else moment.strftime("%Y-%m-%d %H:%M:%S UTC")


def status_class(status: str) -> str:
    return f"status status-{status}"


def elapsed(started: datetime | None, finished: datetime | None, now: datetime) -> float | None:
    """How long a job has run: until it finished, or until now."""
    if started is None:
        return None
    return ((finished or now) - started).total_seconds()


def now_doing(status: str, progress: dict[str, Any] | None) -> JobProgress | None:
    """What a running job does now and its time left, as its last heartbeat said."""
    if status not in ACTIVE_STATUSES or progress is None:
        return None
    return JobProgress.model_validate(progress)


def progress(steps_done: int, total_steps: int, status: str) -> float:
    """The share of steps done, 0..1 (a succeeded job is complete)."""
    if status == JobStatus.succeeded:
        return 1.0
    return min(steps_done / total_steps, 1.0) if total_steps > 0 else 0.0


def paused_reason(status: str, stop_reason: str | None) -> str | None:
    """Why a paused job waits, and what resumes it."""
    if status != JobStatus.paused:
        return None
    if stop_reason == BUDGET_STOP:
        return (
            "Its team's budget for this period is spent: it resumes by itself when the "
            "budget is raised or the period turns (Resume now pauses it again)"
        )
    return "Paused on request: Resume continues from its last saved state"


def is_finished(status: str) -> bool:
    return status in TERMINAL_STATUSES


KL_SHADES = (0.1, 0.5, 1.0, 2.0)
"""Reverse-KL magnitudes where a token's shade darkens (5 shades, CSS classes kl-0..kl-4)."""


@dataclass(frozen=True)
class ShadedToken:
    text: str
    reverse_kl: float | None
    shade: int


@dataclass(frozen=True)
class Rollout:
    """A kept rollout as the job page shows it: the completion token by token, each
    shaded by its reverse KL."""

    step: int
    prompt: str
    tokens: list[ShadedToken]


def shade_tokens(texts: Sequence[str], reverse_kl: Sequence[float | None]) -> list[ShadedToken]:
    return [
        ShadedToken(text, kl, 0 if kl is None else sum(abs(kl) >= edge for edge in KL_SHADES))
        for text, kl in zip(texts, reverse_kl, strict=True)
    ]


def last_value(change: Change | None) -> float | None:
    """The latest value of a summary figure (None when the job never recorded it)."""
    return None if change is None else change.last


def rollout(
    step: int, prompt: str, tokens: Sequence[str], reverse_kl: Sequence[float | None]
) -> Rollout:
    return Rollout(step, prompt, shade_tokens(tokens, reverse_kl))
