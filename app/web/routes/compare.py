"""Compare 2-8 jobs: one metric of each overlaid on one chart, and the spec fields that
differ between them."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, Response

from app.api.deps import MAX_ID, SessionDep
from app.jobs.rows import get_jobs
from app.web import reads
from app.web.charts import MAX_POINTS, REVERSE_KL
from app.web.deps import ViewerDep
from app.web.errors import WebError
from app.web.templating import render
from kernel.spec.documents import differing_fields
from kernel.team_view import masked_spec

router = APIRouter(prefix="/ui", include_in_schema=False)

MIN_JOBS = 2
MAX_JOBS = 8
PICKER_SIZE = 50


@router.get("/compare")
async def compare_page(
    request: Request,
    session: SessionDep,
    viewer: ViewerDep,
    jobs: Annotated[list[int], Query(max_length=MAX_JOBS + 1)] = [],  # noqa: B006
    metric: Annotated[str, Query(max_length=200)] = REVERSE_KL,
) -> Response:
    """With fewer than two jobs chosen, a picker; a job the viewer cannot see is a 404."""
    chosen = list(dict.fromkeys(jobs))
    if len(chosen) > MAX_JOBS:
        raise WebError(400, f"Compare at most {MAX_JOBS} jobs at once.")
    if any(not 1 <= job_id <= MAX_ID for job_id in chosen):
        raise WebError(400, "Job ids are positive integers.")
    if len(chosen) < MIN_JOBS:
        recent, _ = await reads.list_jobs(session, viewer.scope, None, "", 0, PICKER_SIZE)
        context = {"viewer": viewer, "recent": recent, "chosen": chosen}
        return render(request, "compare_pick.html", context)
    picked = await get_jobs(session, chosen, viewer.scope)
    names: dict[str, None] = {}
    for job in picked:
        names.update(dict.fromkeys(await reads.first_metric_names(session, job.id)))
        for _step, _at, metrics in await reads.recent_steps(session, job.id, 1):
            names.update(dict.fromkeys(metrics))
    context = {
        "viewer": viewer,
        "jobs": picked,
        "jobs_json": [{"id": job.id, "name": job.name} for job in picked],
        "max_points": MAX_POINTS,
        "metric": metric,
        "metrics": sorted(names) or [REVERSE_KL],
        "differences": differing_fields(
            [job.spec if viewer.is_admin else masked_spec(job.spec) for job in picked]
        ),
    }
    return render(request, "compare.html", context)
