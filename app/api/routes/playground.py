"""The playground (`POST /v1/jobs/{id}/playground`; `/sample` is its old name): completions
of a job's saved weights (and of its teacher and its untrained student) on a prompt of the
caller's, sampled by a worker."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from app.api.deps import JobDep, PrincipalDep, QueueDep, SessionDep, SettingsDep, WaitsDep
from app.api.errors import ApiError, error_responses
from app.api.openai.stored import Keeping, playground_rows, with_stored_ids
from app.api.routes.jobs import IdempotencyKey
from app.core.idempotency import Idempotency
from app.jobs.tables import Job
from app.playground.schemas import PlaygroundAnswer, PlaygroundRequest
from app.playground.service import REPLAYED_HEADER, PlaygroundError, Sampling, Served

router = APIRouter(prefix="/v1/jobs", tags=["playground"])


async def serve_playground(
    sampling: Sampling,
    job: Job,
    request: PlaygroundRequest,
    idempotency: Idempotency | None = None,
) -> Served[PlaygroundAnswer]:
    """The playground's answer (every door's: the API's and the dashboard's); with
    `store`, each model's completions kept once served, the team's room for them checked
    first (StoredQuotaExceeded: nothing sampled)."""
    session, team_id = sampling.session, sampling.team_id
    models = 1 + len(request.compare)
    store = bool(request.store)
    keeping = await Keeping.of(session, sampling.settings, team_id, store, models)
    respond = with_stored_ids if store else lambda answers: answers[0]
    served = await sampling.serve_all(
        job, [request], keeping.seen(respond), PlaygroundAnswer, idempotency
    )
    await keeping.keep(served, lambda _: playground_rows(team_id, request, served.value))
    return served


async def idempotency_of(key: str | None, route: str, request: Request) -> Idempotency | None:
    """The request as a retry must repeat it (the route and its JSON body), when it has a
    key."""
    return None if key is None else Idempotency(key, route, await request.json())


PLAYGROUND_RESPONSES = error_responses(400, 401, 403, 404, 409, 413, 415, 422, 429, 502, 503, 504)


@router.post(
    "/{job_id}/playground", response_model=PlaygroundAnswer, responses=PLAYGROUND_RESPONSES
)
@router.post(
    "/{job_id}/sample",
    response_model=PlaygroundAnswer,
    responses=PLAYGROUND_RESPONSES,
    deprecated=True,
    summary="The old name of /playground (kept for one release)",
)
async def sample_job(
    job: JobDep,
    request: PlaygroundRequest,
    raw: Request,
    response: Response,
    session: SessionDep,
    principal: PrincipalDep,
    queue: QueueDep,
    settings: SettingsDep,
    waits: WaitsDep,
    idempotency_key: IdempotencyKey = None,
) -> PlaygroundAnswer:
    """Complete the prompt with the job's `checkpoint` (`final` or a step whose sampler
    weights it saved) and with each model in `compare`, `n` times each. Every token comes
    with its logprob; with the teacher compared, every other model's tokens also get the
    teacher's logprob and their reverse KL. A worker answers; past `timeout_seconds`
    (default OPD_SAMPLE_TIMEOUT) the answer is a 504 and the request is withdrawn. The wait
    holds no database connection and one of the team's places per completion (n x models);
    past OPD_TEAM_MAX_WAITING of them waiting at once, a 429 with Retry-After (a request
    asking for more alone: a 422). The tokens sampled are added to the job's usage. With
    an `Idempotency-Key`, a repeat of the request (the same key and body) gets the first
    answer again (`Idempotent-Replayed: true`), sampled and billed once, joining the first
    while it waits; the key with another request is a 422. With `store`, each model's
    completions are kept as a stored completion of the team (its id in the output's
    `stored_completion_id`), as `/v1/chat/completions` keeps one with `store: true`; past
    the team's quota the request is a 429 `stored_completions_quota`, before anything is
    sampled."""
    idempotency = await idempotency_of(idempotency_key, f"POST /v1/jobs/{job.id}/sample", raw)
    sampling = Sampling(session, queue, settings, waits, principal.team_id)
    try:
        served = await serve_playground(sampling, job, request, idempotency)
    except PlaygroundError as error:
        raise ApiError(error.status, error.code, error.message, error.param) from None
    if served.replayed:
        response.headers[REPLAYED_HEADER] = "true"
    return served.value
