"""Cloning a job: its spec with a JSON merge patch applied, submitted as a new job."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body

from app.api.deps import JobDep
from app.api.errors import ApiError, error_responses
from app.api.routes.jobs import SUBMIT_RESPONSES, IdempotencyKey, SubmitterDep
from app.jobs.continuation import editable
from app.jobs.schemas import JobPublic
from app.jobs.uploads import check_same_bytes
from kernel.merge_patch import merge_patch
from kernel.spec import SpecError, parse_spec

router = APIRouter(prefix="/v1/jobs", tags=["jobs"], responses=error_responses(401, 422, 503))

PATCH_EXAMPLES = {
    "learning rate": {"value": {"optim": {"learning_rate": 2e-5}}},
    "continue it": {
        "value": {"student": {"init_from": {"job": 1}}, "loop": {"steps": 50}},
    },
}


@router.post(
    "/{job_id}/clone",
    status_code=201,
    response_model=JobPublic,
    responses={**SUBMIT_RESPONSES, **error_responses(404)},
)
async def clone_job(
    job: JobDep,
    patch: Annotated[
        dict[str, Any],
        Body(
            description="A JSON merge patch (RFC 7386) of the job's spec: objects merge, "
            "`null` returns a field to its default, anything else replaces it.",
            openapi_examples=PATCH_EXAMPLES,
        ),
    ],
    submitter: SubmitterDep,
    idempotency_key: IdempotencyKey = None,
) -> JobPublic:
    """A new job with the job's spec, changed by the patch, and checked and submitted as
    `POST /v1/jobs` checks and submits (so `student.init_from` may continue a job)."""
    try:
        spec = parse_spec(merge_patch(editable(job.spec), patch))
    except SpecError as error:
        param = error.problems[0][0] if error.problems else None
        raise ApiError(422, "invalid_request", str(error), param) from None
    await check_same_bytes(submitter.session, submitter.principal.team_id, job, spec)
    route = f"POST /v1/jobs/{job.id}/clone"
    return await submitter.submit(spec, idempotency_key, route, patch)
