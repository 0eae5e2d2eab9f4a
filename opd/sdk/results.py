"""What the SDK returns beyond the API's own schemas: curves (one job's or several jobs')
that turn into a DataFrame, and a downloaded checkpoint. (A job that can wait for itself
knows its client, so it lives beside it, in client.py.)"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.curves.schemas import JobsMetricsPublic, MetricsPublic

if TYPE_CHECKING:
    import pandas


def need_pandas() -> Any:
    try:
        import pandas
    except ImportError:
        raise ImportError("to_pandas needs pandas: pip install pandas") from None
    return pandas


class Curves(MetricsPublic):
    """A job's curves (`MetricsPublic`), with `points` and `to_pandas`."""

    def points(self, key: str) -> list[tuple[int, float | None]]:
        curve = self.curves.get(key)
        return list(zip(curve.steps, curve.values, strict=True)) if curve else []

    def to_pandas(self) -> pandas.DataFrame:
        """One row per step, one column per metric (NaN where a step lacks it)."""
        pandas = need_pandas()
        columns: dict[str, Any] = {
            key: pandas.Series(curve.values, index=curve.steps, dtype="float64")
            for key, curve in self.curves.items()
        }
        frame = pandas.DataFrame(columns).sort_index()
        frame.index.name = "step"
        return frame


class ComparedCurves(JobsMetricsPublic):
    """Several jobs' curves (`JobsMetricsPublic`), each a `Curves`, in the order asked."""

    jobs: list[Curves]  # type: ignore[assignment]

    def to_pandas(self) -> pandas.DataFrame:
        """One row per step; columns `(job_id, metric)` (NaN where a job lacks the step)."""
        pandas = need_pandas()
        frames = {curves.job_id: curves.to_pandas() for curves in self.jobs}
        frame = pandas.concat(frames, axis=1, names=["job_id", "metric"]).sort_index()
        frame.index.name = "step"
        return frame


@dataclass(frozen=True)
class Download:
    path: Path
    sha256: str = ""
    """Checked as the bytes arrived, against the API's `X-Checkpoint-SHA256` (an archive)
    or `ETag` (an uploaded file)."""
