"""Query parameters shared by the metric endpoints: metric names and a step range."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Query

from app.api.deps import MAX_ID
from app.api.errors import ApiError
from app.store.curves import CurveQuery

MAX_KEYS = 100

KeysParam = Annotated[
    str | None,
    Query(
        description="Comma-separated metric names, e.g. `opd/reverse_kl_mean`; "
        "default: every metric the job recorded."
    ),
]
FromStep = Annotated[int | None, Query(ge=0, le=MAX_ID, description="First step (inclusive).")]
ToStep = Annotated[int | None, Query(ge=0, le=MAX_ID, description="Last step (inclusive).")]


def parse_keys(keys: str | None) -> tuple[str, ...] | None:
    if keys is None:
        return None
    names = tuple(dict.fromkeys(name.strip() for name in keys.split(",") if name.strip()))
    if not names:
        raise ApiError(422, "invalid_request", "keys: give at least one metric name", "keys")
    if len(names) > MAX_KEYS:
        raise ApiError(422, "invalid_request", f"keys: at most {MAX_KEYS} names", "keys")
    return names


def check_range(from_step: int | None, to_step: int | None) -> None:
    if from_step is not None and to_step is not None and from_step > to_step:
        raise ApiError(422, "invalid_request", "from_step must not exceed to_step", "from_step")


def curve_query(
    keys: KeysParam = None,
    from_step: FromStep = None,
    to_step: ToStep = None,
    max_points: Annotated[
        int,
        Query(
            ge=2,
            le=10_000,
            description="Points per curve at most. A longer range keeps each bucket's min and "
            "max point (at least 4 needed for that) and the first and last point.",
        ),
    ] = 1000,
) -> CurveQuery:
    names = parse_keys(keys)
    check_range(from_step, to_step)
    return CurveQuery(names, from_step, to_step, max_points)


CurveQueryDep = Annotated[CurveQuery, Depends(curve_query)]
