"""The API driven from its own OpenAPI document (schemathesis): whatever a client sends, the
answer is never a 5xx and always matches the documented schema; what the document calls
valid is accepted, and what it calls invalid is refused (so a client generated from it
never sends a request the API refuses).

A bounded, deterministic run (10 valid and 10 invalid examples per operation, which reach
the lines of app/ that 25 did within a few, derived from the test itself rather than a
random seed) against the ASGI app on a SQLite file and the machine's Redis, with an admin
key (so that no route is closed to it). Each `answers_within_its_schema` failure shows the
request as a curl command. A long search multiplies every fuzzer's count:
`OPD_FUZZ_SCALE=20 pytest tests/app -k fuzz`.
"""

from __future__ import annotations

import asyncio
import math
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from fastapi import FastAPI
from hypothesis import example, given, settings
from hypothesis import strategies as st
from redis import Redis
from schemathesis import GenerationMode
from schemathesis.python.asgi import shutdown_lifespans
from schemathesis.specs.openapi.checks import positive_data_acceptance
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.auth.keys import NewKey, create_key
from app.auth.schemas import Scope
from app.core.config import Settings
from app.core.db import migrate, standalone_session
from app.main import create_app
from tests.app.conftest import auth
from tests.app.fuzzing import (
    BASE,
    FUZZED,
    JOBS,
    SWEEP,
    as_json,
    control_once,
    examples,
    raw_json,
    specs,
    sweep_definitions,
    with_job_ids,
    with_value,
)
from tests.support import REDIS_URL

EXAMPLES_PER_OPERATION = examples(10)
REPLY_SECONDS = 5
"""A reply takes far less; a metrics stream of a job that is still queued never ends, and is
cut off after this long (any other request that slow fails)."""
CHECKS = schemathesis.Config.from_dict(
    {
        "checks": {
            # What the document calls valid is accepted (or refused for what it says may
            # happen: no such job, a conflict, a full queue, no worker to answer).
            "positive_data_acceptance": {
                "expected-statuses": [200, 201, 202, 204, 304, 404, 409, 429, 503, 504]
            },
            # An oversized invalid body is rightly refused as too large; a route beyond the
            # key's scope is refused before its input is read.
            "negative_data_rejection": {
                "expected-statuses": [400, 401, 403, 404, 405, 409, 413, 415, 422]
            },
        }
    }
)
RULES_BEYOND_JSON_SCHEMA = {
    # A job spec's cross-field rules (save_every a multiple of sampler_refresh_steps, as
    # many answers as prompts, ...), a dataset file inside the data root, a reused
    # Idempotency-Key: the descriptions state them, and a 422 names the field.
    "POST /v1/jobs",
    "POST /v1/jobs/{job_id}/clone",
    "POST /v1/jobs/estimate",  # the same admission, nothing stored
    # An uploaded file must parse as its format (named, or told by the file name) and hold a
    # column of questions: what its bytes hold, not their schema (a 422 says what is wrong).
    "POST /v1/files",
    # A chat's last message must be the user's.
    "POST /v1/jobs/{job_id}/playground",
    "POST /v1/jobs/{job_id}/sample",
    # A sweep's base or base_job (one of them), each parameter's values or range (min below
    # max), values for every parameter of a grid, and a base that is a valid job spec.
    "POST /v1/sweeps",
    "POST /v1/sweeps/estimate",
    # A budget gives tokens or a cost, exactly one of them.
    "PUT /v1/teams/{team}/budget",
    # An audit action filter the log does not record: a 422 that lists those it does.
    "GET /v1/audit",
    # A webhook's URL must name a public address, whatever form its host is spelled in
    # (`http://0` is 0.0.0.0): what the address is, not its schema.
    "POST /v1/webhooks",
    # OpenAI's wire format, checked as the playground's request: a chat's last message the
    # user's, the playground's bounds on n, max_tokens, top_p (a 400 in OpenAI's shape).
    "POST /v1/chat/completions",
    # A list of prompts all texts or all token-id lists, at most 64 of them and 64 choices,
    # max_tokens 0 only when the prompt is scored, the playground's bounds on n,
    # max_tokens, top_p (a 400 in OpenAI's shape).
    "POST /v1/completions",
}


async def new_key(database_url: str) -> str:
    async with standalone_session(database_url) as session:
        return (await create_key(session, "fuzzers", scope=Scope.admin)).key  # every route


@pytest.fixture
def service(tmp_path: Path) -> Iterator[tuple[FastAPI, str]]:
    """The app on a fresh SQLite database and a queue of its own, and a key for it."""
    queue_name = f"opd-fuzz-{uuid.uuid4().hex[:12]}"
    config = Settings(
        home=tmp_path,
        redis_url=REDIS_URL,
        queue_name=queue_name,
        migrate_on_start=False,
        auth_cache_seconds=0,
        job_cache_seconds=0,
        stream_poll_interval=0.05,
    )
    migrate(config.database_url)
    key = asyncio.run(new_key(config.database_url))
    yield create_app(config), key
    shutdown_lifespans()  # schemathesis keeps an app it started running until told
    redis = Redis.from_url(REDIS_URL)
    for name in redis.scan_iter(match=f"*{queue_name}*"):
        redis.delete(name)
    redis.close()


def unstated(label: str) -> list:
    """The checks an operation is exempt from: acceptance, where its rules go beyond what
    JSON Schema can state."""
    return [positive_data_acceptance] if label in RULES_BEYOND_JSON_SCHEMA else []


def has_inputs(operation: schemathesis.APIOperation) -> bool:
    """Whether there is anything to send wrong (no invalid request exists for /healthz)."""
    return bool(list(operation.iter_parameters()) or operation.body)


def test_no_server_errors_and_responses_match_the_schema(
    service: tuple[FastAPI, str],
) -> None:
    app, key = service
    schema = schemathesis.openapi.from_asgi("/openapi.json", app, config=CHECKS)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 11, "every route is in the document"

    runs = [
        (operation, mode)
        for operation in operations
        for mode in GenerationMode
        if mode == GenerationMode.POSITIVE or has_inputs(operation)
    ]
    for operation, mode in runs:

        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(FUZZED, max_examples=EXAMPLES_PER_OPERATION)
        def answers_within_its_schema(case: schemathesis.Case) -> None:
            case.call_and_validate(
                headers={"Authorization": f"Bearer {key}"},
                timeout=REPLY_SECONDS,
                excluded_checks=unstated(case.operation.label),
            )

        answers_within_its_schema()


# --- sweeps and specs beyond the document ------------------------------------------------------

JSON_BODY = {"Content-Type": "application/json"}
DEEP_EXAMPLES = examples(60)
PATH_ID = re.compile(r"/\d+$")


@pytest.fixture
def documented(settings: Settings) -> schemathesis.BaseSchema:
    """The app's OpenAPI document, to hold its answers to."""
    return schemathesis.openapi.from_dict(create_app(settings).openapi())


def answered(response: httpx.Response, documented: schemathesis.BaseSchema, sent: str) -> None:
    """Below 500, and within what the document says of that route and status."""
    assert response.status_code < 500, f"{response.status_code} for {sent[:2000]}"
    route = documented[PATH_ID.sub("/{sweep_id}", response.request.url.path)]
    route[response.request.method].validate_response(response)


def json_texts(documents: st.SearchStrategy[dict[str, Any]], valid: dict[str, Any]) -> Any:
    """Documents as JSON, or `valid` as JSON no encoder writes (`raw_json`)."""
    return documents.map(as_json) | st.sampled_from(raw_json(valid))


UNBOUNDED = "optim.grad_clip_norm"  # a float with no upper bound
INFINITE = with_value(BASE, UNBOUNDED, math.inf)
VALID_SWEEP = SWEEP | {"base": BASE}


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
@given(spec=json_texts(specs(), BASE), definition=json_texts(sweep_definitions(), VALID_SWEEP))
@example(spec=as_json(INFINITE), definition=as_json(VALID_SWEEP))  # issue 25, item 4
@example(
    spec=as_json(BASE),
    definition=as_json(VALID_SWEEP | {"parameters": {UNBOUNDED: {"values": [math.inf]}}}),
)
@example(spec=raw_json(BASE)[0], definition=as_json(SWEEP | {"base": INFINITE}))  # 1e999
@example(
    spec=as_json(BASE),
    definition=as_json(  # item 5: a uniform range over an integer field
        SWEEP | {"base_job": JOBS[0], "parameters": {"loop.steps": {"min": 1, "max": 4}}}
    ),
)
@settings(FUZZED, max_examples=DEEP_EXAMPLES)
async def test_any_sweep_or_spec_is_refused_or_stored_and_run_never_a_server_error(
    spec: str,
    definition: str,
    client: httpx.AsyncClient,
    key: NewKey,
    job_ids: dict[str, int],
    sessions: async_sessionmaker[AsyncSession],
    settings: Settings,
    documented: schemathesis.BaseSchema,
) -> None:
    """POST /v1/sweeps with definitions JSON Schema cannot judge (their cross-field rules,
    Infinity, 2**64, NUL, deep nesting, another team's job): a 4xx or a 201, never a 5xx,
    on Postgres; a stored sweep reads back within its schema, and the controller's pass
    over it (which creates its first trials) does not fail. The same for a job spec."""
    headers = auth(key) | JSON_BODY
    answered(await client.post("/v1/jobs", content=spec, headers=headers), documented, spec)

    definition = with_job_ids(definition, job_ids)
    created = await client.post("/v1/sweeps", content=definition, headers=headers)
    answered(created, documented, definition)
    if created.status_code != 201:
        return
    sweep_id = created.json()["id"]
    await control_once(sessions, settings, sweep_id)
    for path in (f"/v1/sweeps/{sweep_id}", "/v1/sweeps?limit=100"):
        answered(await client.get(path, headers=auth(key)), documented, definition)
