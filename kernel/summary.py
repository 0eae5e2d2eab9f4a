"""What a job produced, in a few numbers: the reverse KL and the held-out eval, first and
last, and the teacher's baseline. One definition for the API's job body, `opd run` and
`opd status`."""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import BaseModel, Field

FirstLast = tuple[float | None, float | None]

SUMMARY_METRICS = {
    "reverse_kl": "opd/reverse_kl_mean",
    "eval_reverse_kl": "eval/reverse_kl_mean",
    "eval_accuracy": "eval/accuracy",
    "teacher_accuracy": "eval/teacher_accuracy",
}


class Change(BaseModel):
    first: float | None = Field(description="At the first step (or eval) recorded.")
    last: float | None = Field(description="At the last step (or eval) recorded.")


class JobSummary(BaseModel):
    """Reverse KL on the training prompts; eval figures on the held-out ones."""

    reverse_kl: Change | None = None
    eval_reverse_kl: Change | None = None
    eval_accuracy: Change | None = None
    teacher_accuracy: float | None = Field(None, description="The teacher on the eval prompts.")


Ends = dict[str, list[float | None]]
"""Each summary metric's first and last point: {name: [first_step, first_value, last_step,
last_value]}, kept on the job row as steps are recorded."""


def advance_ends(
    ends: Mapping[str, list[float | None]],
    step: int,
    metrics: Mapping[str, float | None],
    also: str | None = None,
) -> Ends:
    """`ends` after step `step` recorded `metrics`: a step at or before the first point
    replaces it, one at or after the last replaces that (so a replayed step overwrites).
    Kept for the summary metrics, and `also` (a sweep's trial keeps its sweep's metric)."""
    updated = {name: list(points) for name, points in ends.items()}
    for name in dict.fromkeys([*SUMMARY_METRICS.values(), *([also] if also else [])]):
        if name not in metrics:
            continue
        value = metrics[name]
        points = updated.setdefault(name, [step, value, step, value])
        if step <= points[0]:
            points[0:2] = [step, value]
        if step >= points[2]:
            points[2:4] = [step, value]
    return updated


def summary_of_ends(ends: Mapping[str, list[float | None]]) -> JobSummary:
    return summarize({name: (points[1], points[3]) for name, points in ends.items()})


def summarize(first_last: Mapping[str, FirstLast]) -> JobSummary:
    """The summary from each metric's first and last recorded value (absent = not recorded)."""

    def change(name: str) -> Change | None:
        values = first_last.get(SUMMARY_METRICS[name])
        return None if values is None else Change(first=values[0], last=values[1])

    teacher = first_last.get(SUMMARY_METRICS["teacher_accuracy"])
    return JobSummary(
        reverse_kl=change("reverse_kl"),
        eval_reverse_kl=change("eval_reverse_kl"),
        eval_accuracy=change("eval_accuracy"),
        teacher_accuracy=None if teacher is None else teacher[0],
    )


def summary_lines(summary: JobSummary) -> list[str]:
    """The summary for a terminal, one line per figure that was recorded."""

    def arrow(change: Change) -> str:
        return " -> ".join("n/a" if v is None else f"{v:.4f}" for v in (change.first, change.last))

    lines = []
    for label, change in (
        ("reverse KL (training prompts)", summary.reverse_kl),
        ("reverse KL (held-out prompts)", summary.eval_reverse_kl),
        ("accuracy (held-out prompts)", summary.eval_accuracy),
    ):
        if change is not None:
            lines.append(f"{label}: {arrow(change)}")
    if summary.teacher_accuracy is not None:
        lines.append(f"teacher's accuracy (held-out prompts): {summary.teacher_accuracy:.4f}")
    return lines
