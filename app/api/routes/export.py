"""Every recorded step of a job's metrics as a file, streamed: CSV or JSON Lines."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import AsyncIterator, Sequence
from difflib import get_close_matches
from enum import StrEnum
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import StreamingResponse
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.api.caching import cache_headers, not_modified
from app.api.curve_params import FromStep, KeysParam, ToStep, parse_keys
from app.api.deps import JobDep, SessionDep
from app.api.errors import ApiError, error_responses
from app.curves.store import metric_names, step_texts
from app.jobs.schemas import TERMINAL_STATUSES
from app.jobs.tables import Job
from kernel.wording import did_you_mean

router = APIRouter(
    prefix="/v1/jobs", tags=["metrics"], responses=error_responses(401, 404, 422, 503)
)

PAGE = 5_000  # steps per query; each page is read in a session of its own


class ExportFormat(StrEnum):
    csv = "csv"
    jsonl = "jsonl"


MEDIA_TYPES = {ExportFormat.csv: "text/csv", ExportFormat.jsonl: "application/x-ndjson"}


async def pages(
    sessions: async_sessionmaker[AsyncSession],
    job_id: int,
    from_step: int | None,
    to_step: int | None,
) -> AsyncIterator[list[tuple[int, str]]]:
    """(step, metrics as stored JSON text) pages in step order, each read in its own session."""
    after = (from_step or 0) - 1
    while True:
        async with sessions() as session:
            rows = await step_texts(session, job_id, after, to_step, PAGE)
        if not rows:
            return
        yield rows
        after = rows[-1][0]


AS_WRITTEN = json.JSONDecoder(parse_float=str, parse_int=str)  # numbers stay their stored text


def has_any(metrics: dict[str, Any], keys: Sequence[str] | None) -> bool:
    return keys is None or any(key in metrics for key in keys)


async def csv_text(
    columns: Sequence[str], keys: Sequence[str] | None, rows: AsyncIterator[list[tuple[int, str]]]
) -> AsyncIterator[str]:
    """A header `step,<metric>...`, then one line per step; an absent or null value is
    empty. Values are JSON numbers, which never need CSV quoting."""
    header = io.StringIO()
    csv.writer(header, lineterminator="\n").writerow(["step", *columns])
    yield header.getvalue()
    async for page in rows:
        steps = ((step, AS_WRITTEN.decode(text)) for step, text in page)
        yield "".join(
            f"{step},{','.join(metrics.get(c) or '' for c in columns)}\n"
            for step, metrics in steps
            if has_any(metrics, keys)
        )


def jsonl_line(step: int, text: str, keys: Sequence[str] | None) -> str:
    """`{"step": n, ...}`: the stored object with the step put first (or only the chosen
    metrics; "" when the step has none of them)."""
    if keys is None:
        body = text.strip()[1:].lstrip()
        return f'{{"step":{step}{"" if body.startswith("}") else ","}{body}\n'
    metrics = json.loads(text)
    picked = {key: metrics[key] for key in keys if key in metrics}
    return json.dumps({"step": step, **picked}, separators=(",", ":")) + "\n" if picked else ""


async def jsonl_text(
    keys: Sequence[str] | None, rows: AsyncIterator[list[tuple[int, str]]]
) -> AsyncIterator[str]:
    """One `{"step": n, "<metric>": value, ...}` object per line, as `opd run --metrics-out`."""
    async for page in rows:
        yield "".join(jsonl_line(step, text, keys) for step, text in page)


def unknown_metric(job: Job, name: str, recorded: Sequence[str]) -> str:
    """Why a name is refused: the names closest to it, and every name the job recorded."""
    close = did_you_mean(get_close_matches(name, recorded, 3, 0.5))
    if not recorded:
        return f"job {job.id} has recorded no metrics yet, so none named `{name}`"
    when = "" if job.status in TERMINAL_STATUSES else " (yet)"
    return f"job {job.id} recorded no metric `{name}`{when}{close or '.'} Its metrics: " + (
        ", ".join(recorded)
    )


@router.get(
    "/{job_id}/metrics/export",
    response_class=StreamingResponse,
    responses={
        200: {
            "content": {media: {} for media in MEDIA_TYPES.values()},
            "description": "Every recorded step in step order. CSV: a header `step,<metric>,...` "
            "(the chosen metrics, else every metric sorted by name), empty cells where a step "
            "lacks a metric or its value was not finite. JSONL: one object per step.",
        },
        304: {"description": "Nothing changed since this ETag."},
    },
)
async def export_metrics(
    job: JobDep,
    session: SessionDep,
    request: Request,
    export_format: Annotated[
        ExportFormat, Query(alias="format", description="`csv` (for pandas) or `jsonl`.")
    ] = ExportFormat.csv,
    keys: KeysParam = None,
    from_step: FromStep = None,
    to_step: ToStep = None,
) -> Response:
    """Every step of every (or each chosen) metric, streamed; steps that have none of the
    chosen metrics are left out. A name the job never recorded is a 422 `unknown_metric`
    that lists the names it did."""
    names = parse_keys(keys)
    headers = cache_headers(request, [job], export_format, names, from_step, to_step)
    if unchanged := not_modified(request, headers):
        return unchanged
    recorded = await metric_names(session, job.id)
    if names is not None and (unknown := [name for name in names if name not in recorded]):
        raise ApiError(422, "unknown_metric", unknown_metric(job, unknown[0], recorded), "keys")
    columns = names
    if columns is None and export_format is ExportFormat.csv:
        columns = tuple(recorded)
    await session.close()  # hand the connection back: each page takes its own
    rows = pages(request.app.state.sessions, job.id, from_step, to_step)
    if export_format is ExportFormat.csv:
        body = csv_text(columns or (), names, rows)
    else:
        body = jsonl_text(names, rows)
    filename = f"job-{job.id}-metrics.{export_format}"
    headers["Content-Disposition"] = f'attachment; filename="{filename}"'
    return StreamingResponse(body, media_type=MEDIA_TYPES[export_format], headers=headers)
