"""Curves of several jobs in one call, for comparison charts."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, Response

from app.api.caching import AnswersDep, answer, cache_headers, not_modified
from app.api.curve_params import CurveQueryDep
from app.api.deps import PrincipalDep, SessionDep
from app.api.errors import error_responses
from app.curves.schemas import JobsMetricsPublic
from app.curves.store import read_curves
from app.jobs.rows import get_jobs

router = APIRouter(
    prefix="/v1/metrics", tags=["metrics"], responses=error_responses(401, 404, 422, 503)
)

MAX_JOBS = 20


JOB_ID = "[1-9][0-9]{0,8}"
JOB_IDS = f"^{JOB_ID}(,{JOB_ID}){{0,{MAX_JOBS - 1}}}$"
"""1 to 20 job ids (each up to 999999999), comma-separated: the document states the rule."""


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
    jobs: Annotated[
        str,
        Query(
            pattern=JOB_IDS,
            description=f"Comma-separated job ids, at most {MAX_JOBS}, e.g. `1,2,3`.",
        ),
    ],
) -> Response:
    """The curves of each job (as `GET /v1/jobs/{id}/metrics` gives them), in the order
    asked for. A job of another team is a 404, as everywhere."""
    ids = list(dict.fromkeys(int(part) for part in jobs.split(",")))
    found = await get_jobs(session, ids, principal.scope)
    headers = cache_headers(request, found, query)
    if unchanged := not_modified(request, headers):
        return unchanged

    async def read() -> JobsMetricsPublic:
        return JobsMetricsPublic(jobs=[await read_curves(session, job.id, query) for job in found])

    return await answer(answers, headers, read)
