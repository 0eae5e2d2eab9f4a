"""What the SDK returns beyond the API's own schemas: a job that can wait for itself, and
curves that turn into a DataFrame."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import PrivateAttr

from app.curves.schemas import MetricsPublic
from app.jobs.schemas import JobPublic

if TYPE_CHECKING:
    import pandas

    from opd.sdk.client import AsyncClient, Client


class Job(JobPublic):
    """A job as the API shows it (`JobPublic`), that knows the client it came from."""

    _client: Client = PrivateAttr()

    def refresh(self) -> Job:
        return self._client.jobs.get(self.id)

    def wait(
        self, *, progress: bool = False, interval: float = 1.0, timeout: float | None = None
    ) -> Job:
        """Poll until the job ends; `progress`: a bar with the reverse KL on stderr."""
        return self._client.jobs.wait(
            self.id, progress=progress, interval=interval, timeout=timeout
        )


class AsyncJob(JobPublic):
    """`Job` for the AsyncClient: `await job.wait()`."""

    _client: AsyncClient = PrivateAttr()

    async def refresh(self) -> AsyncJob:
        return await self._client.jobs.get(self.id)

    async def wait(
        self, *, progress: bool = False, interval: float = 1.0, timeout: float | None = None
    ) -> AsyncJob:
        return await self._client.jobs.wait(
            self.id, progress=progress, interval=interval, timeout=timeout
        )


class Curves(MetricsPublic):
    """A job's curves (`MetricsPublic`), with `points` and `to_pandas`."""

    def points(self, key: str) -> list[tuple[int, float | None]]:
        curve = self.curves.get(key)
        return list(zip(curve.steps, curve.values, strict=True)) if curve else []

    def to_pandas(self) -> pandas.DataFrame:
        """One row per step, one column per metric (NaN where a step lacks it)."""
        try:
            import pandas
        except ImportError:
            raise ImportError("Curves.to_pandas needs pandas: pip install pandas") from None
        columns: dict[str, Any] = {
            key: pandas.Series(curve.values, index=curve.steps, dtype="float64")
            for key, curve in self.curves.items()
        }
        frame = pandas.DataFrame(columns).sort_index()
        frame.index.name = "step"
        return frame


@dataclass(frozen=True)
class Download:
    path: Path
    sha256: str = ""
    """Checked against the API's `X-Checkpoint-SHA256` as the archive arrived."""
