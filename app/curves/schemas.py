"""Curves as the API returns them: each metric's points, and how they were downsampled."""

from typing import Literal

from pydantic import BaseModel, Field


class MetricCurve(BaseModel):
    steps: list[int]
    values: list[float | None]


class Downsampling(BaseModel):
    """How the curves were cut down to `max_points`."""

    method: Literal["none", "minmax"] = Field(
        description="`none`: every recorded point. `minmax`: each bucket's min and max point "
        "in step order, plus the range's first and last point."
    )
    first_step: int | None = Field(description="The first recorded step in the range.")
    last_step: int | None = Field(description="The last recorded step in the range.")
    buckets: int | None = Field(description="Buckets the range was cut into (minmax).")
    bucket_steps: int | None = Field(
        description="Steps per bucket, about: buckets follow stored block boundaries."
    )


class MetricsPublic(BaseModel):
    """Curves by metric name: exact when short, else each bucket's min and max (spikes are
    kept); the first and last points are always kept. Null values are non-finite ones."""

    job_id: int
    curves: dict[str, MetricCurve]
    downsampling: Downsampling


class JobsMetricsPublic(BaseModel):
    """Curves of several jobs, in the order asked for."""

    jobs: list[MetricsPublic]
