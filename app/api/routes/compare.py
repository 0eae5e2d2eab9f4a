"""Curves of several jobs in one call, for comparison charts."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, Response

from app.api.caching import AnswersDep, answer, cache_headers, not_modified
from app.api.curve_params import CurveQueryDep
from app.api.deps import MAX_ID, PrincipalDep, SessionDep
from app.api.errors import ApiError, error_responses
from app.models import JobsMetricsPublic
from app.store.curves import read_curves
from app.store.rows import get_jobs

router = APIRouter(
    prefix="/v1/metrics", tags=["metrics"], responses=error_responses(401, 404, 422, 503)
)

MAX_JOBS = 20


def parse_job_ids(jobs: str) -> list[int]:
    try:
        ids = list(dict.fromkeys(int(part) for part in jobs.split(",") if part.strip()))
    except ValueError:
        raise ApiError(
            422, "invalid_request", "jobs: give comma-separated job ids, e.g. 1,2,3", "jobs"
        ) from None
    if not ids:
        raise ApiError(422, "invalid_request", "jobs: give at least one job id", "jobs")
    if len(ids) > MAX_JOBS:
        raise ApiError(422, "invalid_request", f"jobs: at most {MAX_JOBS} ids", "jobs")
    if not all(1 <= job_id <= MAX_ID for job_id in ids):
        raise ApiError(422, "invalid_request", f"jobs: ids are 1 to {MAX_ID}", "jobs")
    return ids


@router.get(
    "",
    response_model=JobsMetricsPublic,
    responses={304: {"description": "None of the jobs' curves changed since this ETag."}},
)
async def read_jobs_metrics(
    session: SessionDep,
    principal: PrincipalDep,
    request: Request,
    answers: AnswersDep,
    query: CurveQueryDep,
    jobs: Annotated[str, Query(description=f"Comma-separated job ids, at most {MAX_JOBS}.")],
) -> Response:
    """The curves of each job (as `GET /v1/jobs/{id}/metrics` gives them), in the order
    asked for. A job of another team is a 404, as everywhere."""
    found = await get_jobs(session, parse_job_ids(jobs), principal.scope)
    headers = cache_headers(request, found, query)
    if unchanged := not_modified(request, headers):
        return unchanged

    async def read() -> JobsMetricsPublic:
        return JobsMetricsPublic(jobs=[await read_curves(session, job.id, query) for job in found])

    return await answer(answers, headers, read)
