"""OpenAI-compatible completions of a job's models (app/api/openai/names.py says what
they are called), sampled through the playground's path: a worker answers within a
deadline, on the key's team's jobs only. Errors come in OpenAI's shape."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, TypeVar

from fastapi import APIRouter, Path, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ValidationError
from sqlalchemy.ext.asyncio import AsyncSession

from app.api.deps import PrincipalDep, QueueDep, SessionDep, SettingsDep, WaitsDep
from app.api.errors import ApiError, error_responses
from app.api.openai.completions import (
    CompletionRequest,
    TextCompletion,
    text_completion,
)
from app.api.openai.errors import OpenAIRoute, model_not_found, openai_error_responses
from app.api.openai.names import NAME_PATTERN, ModelName, listed, parse_model, resumes_after
from app.api.openai.stored import Keeping, chat_row, text_row
from app.api.openai.wire import (
    ChatCompletion,
    ChatCompletionRequest,
    Model,
    ModelList,
    chat_completion,
    stream_events,
)
from app.api.routes.jobs import IdempotencyKey
from app.api.routes.playground import idempotency_of
from app.auth.keys import Principal
from app.auth.tables import Team
from app.core.idempotency import Idempotency
from app.jobs.aliases import aliased, aliases
from app.jobs.checkpoints import CheckpointUnavailable, sampler_weights, saved_samplers
from app.jobs.errors import JobNotFound
from app.jobs.rows import get_job
from app.jobs.tables import Job
from app.playground.schemas import PlaygroundAnswer
from app.playground.service import REPLAYED_HEADER, PlaygroundError, Sampling, Served
from kernel.playground import SampleRequest

R = TypeVar("R", bound=BaseModel)
router = APIRouter(prefix="/v1", tags=["openai"], route_class=OpenAIRoute)
MODELS_PAGE = 1000
MAX_MODELS_PAGE = 10_000
"""`GET /v1/models` answers pages of models (a job saving every step has one per step)."""


async def model_job(
    session: AsyncSession, principal: Principal, model: str
) -> tuple[ModelName, Job]:
    """The model a name means and its job, if the caller's team owns that job (else the
    same 404 as for a model that does not exist); an alias of the team (a spec's `alias`)
    means the final weights of the newest succeeded job that carries it."""
    name = parse_model(model)
    if name is None:
        job = await aliased(session, principal.team_id, model)
        if job is None:
            raise model_not_found(model)
        assert job.id is not None
        return ModelName(job.id), job
    try:
        return name, await get_job(session, name.job_id, principal.scope)
    except JobNotFound:
        raise model_not_found(model) from None


async def serve_door(
    sampling: Sampling,
    job: Job,
    requests: list[SampleRequest],
    respond: Callable[[list[PlaygroundAnswer]], R],
    kind: type[R],
    idempotency: Idempotency | None,
) -> Served[R]:
    """The playground's answers as this door's response; their failures as OpenAI's errors
    (saved weights the job does not have: a model that does not exist)."""
    try:
        return await sampling.serve_all(job, requests, respond, kind, idempotency)
    except PlaygroundError as error:
        if error.param == "checkpoint":
            raise ApiError(404, "model_not_found", error.message, "model") from None
        raise ApiError(error.status, error.code, error.message, error.param) from None


@router.post(
    "/chat/completions",
    response_model=ChatCompletion,
    responses=openai_error_responses(400, 401, 403, 404, 409, 429, 502, 503, 504)
    | error_responses(413, 415),  # the body limit answers before any route, in the service's shape
)
async def create_chat_completion(
    body: ChatCompletionRequest,
    raw: Request,
    principal: PrincipalDep,
    session: SessionDep,
    queue: QueueDep,
    settings: SettingsDep,
    waits: WaitsDep,
    idempotency_key: IdempotencyKey = None,
) -> Response | ChatCompletion:
    """Complete the chat with the model named, `n` times, each token with its logprob
    when `logprobs` is true. A worker samples, as for the playground: past
    `timeout_seconds` (default OPD_SAMPLE_TIMEOUT) the answer is a 504. The usage is
    counted in the job's (and so its team's) usage. With an `Idempotency-Key`, a repeat of
    the request gets the first completion again (`Idempotent-Replayed: true`), sampled and
    billed once; the key with another request is a 400. With `stream`, the SSE chunks are
    sent once the whole completion is ready."""
    name, job = await model_job(session, principal, body.model)
    try:
        request = body.playground_request(name)
    except ValidationError as error:
        raise RequestValidationError(error.errors()) from None
    idempotency = await idempotency_of(idempotency_key, "POST /v1/chat/completions", raw)
    keeping = await Keeping.of(session, settings, principal.team_id, bool(body.store))
    served = await serve_door(
        Sampling(session, queue, settings, waits, principal.team_id),
        job,
        [request],
        keeping.seen(lambda answers: chat_completion(str(name), answers[0], bool(body.logprobs))),
        ChatCompletion,
        idempotency,
    )
    headers = {REPLAYED_HEADER: "true"} if served.replayed else None
    completion = served.value
    await keeping.keep(
        served, lambda answers: [chat_row(principal.team_id, job.id, body, completion, answers)]
    )
    if body.stream:
        include_usage = body.stream_options is not None and body.stream_options.include_usage
        events = stream_events(completion, include_usage)
        return StreamingResponse(events, media_type="text/event-stream", headers=headers)
    return JSONResponse(completion.model_dump(mode="json"), headers=headers)


@router.post(
    "/completions",
    response_model=TextCompletion,
    responses=openai_error_responses(400, 401, 403, 404, 409, 429, 502, 503, 504)
    | error_responses(413, 415),
)
async def create_completion(
    body: CompletionRequest,
    raw: Request,
    principal: PrincipalDep,
    session: SessionDep,
    queue: QueueDep,
    settings: SettingsDep,
    waits: WaitsDep,
    idempotency_key: IdempotencyKey = None,
) -> Response | TextCompletion:
    """Complete the prompt (a text or token ids, read as given: no chat template), or each
    of a list of up to 64 prompts, with the model named, `n` times; with `echo`, the text
    starts with the prompt, and with `logprobs` each token has its logprob, the prompt's
    too (null for its first); with `max_tokens: 0` the prompt is only scored. The values
    are the playground's: the sampler's for sampled tokens, the prefill that scores a text
    (as the teacher scores) for the prompt's; `top_logprobs` holds the `logprobs` k
    likeliest tokens at each position and the chosen one. A worker answers each prompt,
    as for the playground, within `timeout_seconds`, each in its team's turn; the request
    holds one of the team's OPD_TEAM_MAX_WAITING places per choice (prompts x n); the usage
    counts in the job's; an `Idempotency-Key` makes a retry safe, as for chat completions."""
    name, job = await model_job(session, principal, body.model)
    requests = body.playground_requests(name)
    idempotency = await idempotency_of(idempotency_key, "POST /v1/completions", raw)
    keeping = await Keeping.of(session, settings, principal.team_id, bool(body.store))
    scoring = principal.job_id is not None  # spends as its job (app/playground/service.py)
    served = await serve_door(
        Sampling(session, queue, settings, waits, principal.team_id, scoring),
        job,
        requests,
        keeping.seen(lambda answers: text_completion(body, answers, str(name))),
        TextCompletion,
        idempotency,
    )
    headers = {REPLAYED_HEADER: "true"} if served.replayed else None
    await keeping.keep(
        served, lambda answers: [text_row(principal.team_id, job.id, body, served.value, answers)]
    )
    return JSONResponse(served.value.model_dump(mode="json"), headers=headers)


@router.get("/models", response_model=ModelList, responses=openai_error_responses(400, 401, 403))
async def list_models(
    principal: PrincipalDep,
    session: SessionDep,
    after: Annotated[
        str | None,
        Query(
            max_length=64,
            pattern=NAME_PATTERN,
            description="List the models after this one (a page's `last_id`).",
        ),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_MODELS_PAGE)] = MODELS_PAGE,
) -> ModelList:
    """The models of the team's jobs with saved weights, newest job first: each job's final
    weights, teacher and base once it has final weights, then each step it saved sampler
    weights after. A page holds `limit` models; while `has_more`, pass `last_id` as `after`
    for the next one (`client.models.list()` of the `openai` package reads the first page;
    `extra_query={"after": ...}` reads the next). The first page starts with the team's
    aliases (a spec's `alias`, beside its `limit`), each dated by the job it names."""
    start = resumes_after(after)
    teams, saved = await saved_samplers(session, principal.scope, start, limit + 1)
    named = listed(teams, saved, start)[: limit + 1]
    models = [
        Model(
            id=str(name), created=int(weights.created_at.timestamp()), owned_by=teams[name.job_id]
        )
        for name, weights in named
    ]
    page = ModelList.of(models, limit, lambda model: model.id)
    if after is None:
        page.data[:0] = await alias_models(session, principal.team_id)
        page.first_id = page.data[0].id if page.data else None
    return page


async def alias_models(session: AsyncSession, team_id: int) -> list[Model]:
    """The team's aliases as models, alphabetically, each dated by when its job ended."""
    named = await aliases(session, team_id)
    team = await session.get(Team, team_id)
    assert team is not None  # the caller's team
    return [
        Model(
            id=alias,
            created=int(ended.timestamp()) if ended else 0,
            owned_by=team.name,
        )
        for alias, ended in sorted(named.items())
    ]


@router.get(
    "/models/{model}", response_model=Model, responses=openai_error_responses(400, 401, 403, 404)
)
async def retrieve_model(
    model: Annotated[str, Path(max_length=64, description="A model's name, e.g. job-12.")],
    principal: PrincipalDep,
    session: SessionDep,
) -> Model:
    """One model (or alias), if its job is the team's and has the weights it needs."""
    name, job = await model_job(session, principal, model)
    try:
        checkpoint = await sampler_weights(session, job, name.checkpoint)
    except CheckpointUnavailable as error:
        raise ApiError(404, "model_not_found", str(error), "model") from None
    team = await session.get(Team, job.team_id)
    assert team is not None  # a job's team is never deleted
    return Model(id=model, created=int(checkpoint.created_at.timestamp()), owned_by=team.name)
