"""Query parameters shared by the metric endpoints: metric names and a step range."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Query

from app.api.deps import MAX_ID
from app.curves.store import CurveQuery

MAX_KEYS = 100
BLANK = " \t\n\r\f\v"
NAME = f"[^,]*[^,{BLANK}][^,]*"
KEYS = f"^{NAME}(,{NAME}){{0,{MAX_KEYS - 1}}}$"
"""1 to 100 comma-separated metric names, none blank: the document states the rule."""

KeysParam = Annotated[
    str | None,
    Query(
        pattern=KEYS,
        description=f"Comma-separated metric names (at most {MAX_KEYS}), e.g. "
        "`opd/reverse_kl_mean`; default: every metric the job recorded.",
    ),
]
FromStep = Annotated[int | None, Query(ge=0, le=MAX_ID, description="First step (inclusive).")]
ToStep = Annotated[
    int | None,
    Query(ge=0, le=MAX_ID, description="Last step (inclusive); before `from_step`: no steps."),
]


def parse_keys(keys: str | None) -> tuple[str, ...] | None:
    """The names of a `keys` the pattern accepted, each once."""
    if keys is None:
        return None
    return tuple(dict.fromkeys(name.strip(BLANK) for name in keys.split(",")))


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
    return CurveQuery(parse_keys(keys), from_step, to_step, max_points)


CurveQueryDep = Annotated[CurveQuery, Depends(curve_query)]
