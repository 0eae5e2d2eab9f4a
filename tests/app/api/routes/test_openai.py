"""The OpenAI-compatible routes with no worker running: model names, how a request maps
onto the playground's, the models a team sees, and every error in OpenAI's shape (other
routes keep the service's). With real processes and the `openai` package as the client:
tests/e2e/test_openai.py."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import openai
import pytest
from sqlalchemy import event, insert

from app.api.openai.completions import CompletionRequest
from app.api.openai.names import ModelName, names_of, parse_model
from app.api.openai.wire import ChatCompletionRequest
from app.auth.schemas import Scope
from app.core.tables import utcnow
from app.core.worker_calls import quick_queue
from app.jobs.schemas import CheckpointKind
from app.jobs.store import claim_job
from app.jobs.tables import Checkpoint
from app.records.store import record_checkpoint, record_step
from tests.app.api.routes.test_playground import all_waiting, withdrawn
from tests.app.conftest import auth, serve
from tests.app.usage.test_store import usage

CHAT = [{"role": "user", "content": "What is 2 + 3?"}]


@pytest.mark.parametrize(
    ("name", "meant"),
    [
        ("job-12", ModelName(12)),
        ("job-12@step-300", ModelName(12, 300)),
        ("job-12@step-0", ModelName(12, 0)),
        ("job-12:teacher", ModelName(12, role="teacher")),
        ("job-12:base", ModelName(12, role="base")),
    ],
)
def test_a_models_name_says_its_job_weights_and_role_and_reads_back_the_same(name, meant):
    assert parse_model(name) == meant and str(meant) == name


@pytest.mark.parametrize(
    "name",
    [
        "gpt-4o",
        "job-0",
        "job-012",
        "job-12@step-",
        "job-12@final",
        "job-12@step-3:teacher",
        "job-12:judge",
        " job-12",
        "job-99999999999",
        "job-1@step-1000000",
    ],
)
def test_a_name_no_model_can_have_means_none(name):
    assert parse_model(name) is None


def test_a_jobs_models_are_its_final_weights_teacher_base_and_each_saved_step():
    saved = [
        Checkpoint(id=1, job_id=7, step=5, kind=CheckpointKind.sampler, path="/a/5"),
        Checkpoint(id=2, job_id=7, step=5, kind=CheckpointKind.sampler, path="/b/5"),  # replayed
        Checkpoint(id=3, job_id=7, step=10, kind=CheckpointKind.final, path="/a/10"),
    ]
    named = {str(name): checkpoint.path for name, checkpoint in names_of(7, saved)}
    assert named == {
        "job-7": "/a/10",
        "job-7:teacher": "/a/10",
        "job-7:base": "/a/10",
        "job-7@step-5": "/b/5",
        "job-7@step-10": "/a/10",
    }
    assert [str(name) for name, _ in names_of(7, saved[:2])] == ["job-7@step-5"]


def test_a_chat_request_maps_onto_the_playgrounds():
    body = ChatCompletionRequest.model_validate(
        {
            "model": "job-3@step-2",
            "messages": [
                {"role": "developer", "content": "Be brief."},
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                },
            ],
            "max_completion_tokens": 9,
            "temperature": 0,
            "top_p": 0.5,
            "n": 3,
            "stop": "\n",
            "seed": 11,
            "logprobs": True,
            "top_logprobs": 0,
            "user": "eval-harness",
        }
    )
    request = body.playground_request(parse_model(body.model))

    assert [m.template() for m in request.messages or []] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "a\nb"},
    ]
    assert (request.checkpoint, request.model, request.compare) == (2, "checkpoint", [])
    assert (request.max_tokens, request.temperature, request.top_p, request.n) == (9, 0, 0.5, 3)
    assert (request.stop, request.seed, request.timeout_seconds) == (["\n"], 11, None)
    teacher = ChatCompletionRequest(model="job-3:teacher", messages=CHAT)
    asked = teacher.playground_request(parse_model(teacher.model))
    assert (asked.checkpoint, asked.model, asked.max_tokens, asked.n) == (
        "final",
        "teacher",
        256,
        1,
    )


@pytest.mark.parametrize(
    ("prompt", "asked"),
    [
        ("2 + 3 =", {"text": "2 + 3 ="}),
        ([5, 6, 7], {"prompt_token_ids": [5, 6, 7]}),
        (["2 + 3 ="], {"text": "2 + 3 ="}),
        ([[5, 6]], {"prompt_token_ids": [5, 6]}),
    ],
)
def test_a_completion_request_maps_onto_the_playgrounds_with_its_prompt_as_given(prompt, asked):
    scored = CompletionRequest(
        model="job-3:teacher", prompt=prompt, echo=True, logprobs=1, max_tokens=0
    )
    (request,) = scored.playground_requests(parse_model(scored.model))
    given = request.model_dump(include={"text", "prompt_token_ids"}, exclude_none=True)
    assert given == asked and request.prompt is None and request.messages is None
    assert (request.model, request.checkpoint, request.max_tokens) == ("teacher", "final", 0)
    assert request.prompt_logprobs and request.top_logprobs == 1
    sampled = CompletionRequest(
        model="job-3@step-2", prompt=prompt, n=2, stop="\n", seed=4, temperature=0, logprobs=2
    )
    (request,) = sampled.playground_requests(parse_model(sampled.model))
    assert (request.checkpoint, request.max_tokens, request.n, request.stop) == (2, 16, 2, ["\n"])
    assert (request.seed, request.temperature, request.prompt_logprobs) == (4, 0, False)
    assert request.top_logprobs == 2
    vllm = CompletionRequest(model="job-3", prompt=prompt, prompt_logprobs=0, max_tokens=0)
    (request,) = vllm.playground_requests(parse_model(vllm.model))
    assert request.prompt_logprobs and request.top_logprobs == 0
    both = CompletionRequest(model="job-3", prompt=prompt, prompt_logprobs=4, logprobs=0)
    assert both.playground_requests(parse_model(both.model))[0].top_logprobs == 4


@pytest.mark.parametrize(
    ("prompts", "field"), [(["1 +", "2 + 3 ="], "text"), ([[5], [6, 7]], "prompt_token_ids")]
)
def test_a_list_of_prompts_is_one_playground_request_each_with_the_same_settings(prompts, field):
    body = CompletionRequest(model="job-3@step-2", prompt=prompts, n=2, seed=4, max_tokens=3)
    requests = body.playground_requests(parse_model(body.model))

    assert [getattr(request, field) for request in requests] == prompts
    assert {(r.checkpoint, r.n, r.seed, r.max_tokens) for r in requests} == {(2, 2, 4, 3)}
    assert body.batched() and body.prompts() == prompts


@pytest.fixture
def saved_job(session, submit):
    """A running job of the caller's team that saved sampler weights after step 2."""

    async def make(**as_key: Any) -> dict[str, Any]:
        job = await submit(loop={"steps": 4}, **as_key)
        await claim_job(session, job["id"], "w", heartbeat_timeout=60)
        await record_checkpoint(session, job["id"], "w", 2, "sampler", "/w/2")
        return job

    return make


def assert_openai_error(response, status: int, kind: str, code: str, param: str | None = None):
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert (error["type"], error["code"], error["param"]) == (kind, code, param), error
    return error["message"]


def chat(model: str, **body: Any) -> dict[str, Any]:
    return {"model": model, "messages": CHAT, "max_tokens": 4} | body


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({"top_logprobs": 5}, "top_logprobs", "only 0 is supported"),
        ({"presence_penalty": 0.5}, "presence_penalty", "only 0 is supported"),
        ({"tool_choice": "required"}, "tool_choice", "should be 'auto'"),
        ({"parallel_tool_calls": True}, "parallel_tool_calls", "unknown field"),
        ({"max_token": 4}, "max_token", "max_token: unknown field; did you mean `max_tokens`?"),
        ({"n": 100}, "n", "less than or equal to 16, not 100"),
        ({"temperature": 2.5}, "temperature", "less than or equal to 2, not 2.5"),
        ({"temperature": -0.1}, "temperature", "greater than or equal to 0"),
        ({"top_p": 1.5}, "top_p", "less than or equal to 1"),
        ({"top_p": 0}, "top_p", "greater than 0"),
        ({"n": 0}, "n", "greater than or equal to 1"),
        ({"max_tokens": 5000}, "max_tokens", "less than or equal to 4096"),
        ({"presence_penalty": 3}, "presence_penalty", "less than or equal to 2"),
        ({"frequency_penalty": -3}, "frequency_penalty", "greater than or equal to -2"),
        ({"top_logprobs": 21}, "top_logprobs", "less than or equal to 20"),
        ({"max_tokens": 0}, "max_tokens", "greater than or equal to 1"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop", "at most 4"),
        (
            {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]},
            "messages",
            "messages: the last message must be the user's or a tool's reply",
        ),
        ({"messages": [{"role": "assistant", "content": "a"}]}, "messages", "has no user turn"),
        (
            {"messages": [{"role": "user", "content": "q"}, {"role": "tool", "content": "a"}]},
            "messages.1",
            "a tool's reply answers no call",
        ),
        ({"messages": [{"role": "bot", "content": "a"}]}, "messages.0.role", "'tool'"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages.0.content", "a list, not 5"),
        ({"messages": []}, "messages", "at least 1"),
    ],
)
async def test_a_bad_request_is_a_400_in_openais_shape_naming_the_param(
    client, key, saved_job, body, param, words
):
    job = await saved_job()
    response = await client.post(
        "/v1/chat/completions", json=chat(f"job-{job['id']}@step-2", **body), headers=auth(key)
    )
    assert words in assert_openai_error(
        response, 400, "invalid_request_error", "invalid_request", param
    )


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({"prompt": ["a"] * 65}, "prompt", "at most 64 prompts per request (65 given)"),
        ({"prompt": [[1]] * 65}, "prompt", "at most 64 prompts per request (65 given)"),
        ({"prompt": ["a"] * 33, "n": 2}, "n", "at most 64 choices per request: 33 prompts x n 2"),
        ({"prompt": []}, "prompt", "give a prompt"),
        ({"prompt": ""}, "prompt", "at least 1 character"),
        ({"prompt": ["a", ""]}, "prompt.1", "at least 1 character"),
        ({"prompt": [[]]}, "prompt.0", "at least 1 item"),
        ({"prompt": [3, -1]}, "prompt.1", "greater than or equal to 0"),
        ({"prompt": [[3], [2, -1]]}, "prompt.1.1", "greater than or equal to 0"),
        ({"prompt": ["a", [1]]}, "prompt", "all texts or all token-id lists"),
        ({"prompt": "a", "max_tokens": 0}, "max_tokens", "0 only with prompt_logprobs"),
        ({"prompt": "a", "temperature": 3}, "temperature", "less than or equal to 2, not 3"),
        ({"prompt": "a", "top_p": 2}, "top_p", "less than or equal to 1"),
        ({"prompt": "a", "n": 0}, "n", "greater than or equal to 1"),
        ({"prompt": "a", "presence_penalty": 9}, "presence_penalty", "less than or equal to 2"),
        ({"prompt": "a", "max_tokens": 5000}, "max_tokens", "less than or equal to 4096"),
        ({"prompt": "a", "logprobs": 21}, "logprobs", "less than or equal to 20"),
        ({"prompt": "a", "prompt_logprobs": -1}, "prompt_logprobs", "greater than or equal"),
        ({"prompt": "a", "n": 2, "best_of": 3}, "best_of", "only n is supported"),
        ({"prompt": "a", "stream": True}, "stream", "stream: should be false, not true"),
        ({"prompt": "a", "suffix": "b"}, "suffix", "suffix: unknown field"),
        ({"prompt": "a", "presence_penalty": 1}, "presence_penalty", "only 0 is supported"),
        ({"prompt": "a", "n": 17}, "n", "less than or equal to 16"),
        ({}, "prompt", "prompt: this field is required"),
    ],
)
async def test_a_bad_completion_request_is_a_400_in_openais_shape_naming_the_param(
    client, key, saved_job, body, param, words
):
    job = await saved_job()
    response = await client.post(
        "/v1/completions", json={"model": f"job-{job['id']}@step-2"} | body, headers=auth(key)
    )
    assert words in assert_openai_error(
        response, 400, "invalid_request_error", "invalid_request", param
    )


async def test_json_that_does_not_parse_is_a_400(client, key):
    response = await client.post(
        "/v1/chat/completions",
        content=b"{not json",
        headers=auth(key) | {"Content-Type": "application/json"},
    )
    assert "not valid JSON" in assert_openai_error(
        response, 400, "invalid_request_error", "invalid_request", "body"
    )


async def test_a_missing_key_is_an_authentication_error(client):
    response = await client.post("/v1/chat/completions", json=chat("job-1"))
    assert "missing API key" in assert_openai_error(
        response, 401, "authentication_error", "unauthorized"
    )
    assert response.headers["www-authenticate"] == "Bearer"


async def test_another_teams_job_and_a_job_that_is_not_there_are_the_same_404(
    client, key, make_key, saved_job
):
    theirs = await saved_job(as_key=await make_key())
    missing = theirs["id"] + 1000
    answers = [
        await client.post(
            "/v1/chat/completions", json=chat(f"job-{job_id}@step-2"), headers=auth(key)
        )
        for job_id in (theirs["id"], missing)
    ]
    answers.append(await client.get(f"/v1/models/job-{theirs['id']}@step-2", headers=auth(key)))
    completion = {"model": f"job-{theirs['id']}@step-2", "prompt": [1, 2], "max_tokens": 1}
    answers.append(await client.post("/v1/completions", json=completion, headers=auth(key)))

    messages = [
        assert_openai_error(r, 404, "invalid_request_error", "model_not_found", "model")
        for r in answers
    ]
    assert (
        messages[0]
        == f"The model `job-{theirs['id']}@step-2` does not exist or you do not have access to it."
    )
    assert messages[1] == messages[0].replace(str(theirs["id"]), str(missing))
    assert messages[2] == messages[3] == messages[0]


async def test_weights_the_job_did_not_save_are_a_404_that_says_which_it_has(
    client, key, saved_job
):
    job = await saved_job()
    for model in (f"job-{job['id']}@step-3", f"job-{job['id']}", f"job-{job['id']}:teacher"):
        response = await client.post("/v1/chat/completions", json=chat(model), headers=auth(key))
        message = assert_openai_error(
            response, 404, "invalid_request_error", "model_not_found", "model"
        )
        assert "it saved sampler weights after steps: 2" in message


async def test_a_request_no_worker_takes_is_a_504_server_error_and_is_withdrawn(
    client, key, saved_job, redis, queue_name
):
    job = await saved_job()
    body = chat(f"job-{job['id']}@step-2", timeout_seconds=0.3)
    response = await client.post("/v1/chat/completions", json=body, headers=auth(key))

    message = assert_openai_error(response, 504, "server_error", "worker_timeout")
    assert "no worker answered within 0.3 s" in message
    assert await redis.zcard(quick_queue(queue_name)) == 0


async def test_a_list_of_prompts_waits_in_a_place_per_completion_of_its_teams(
    settings, key, make_key, saved_job, redis, queue_name
):
    """4 prompts x n 2 hold all 8 of the team's places (OPD_TEAM_MAX_WAITING): one more
    completion of the team is a 429 at once; another team's waits in places of its own."""
    ours = await saved_job()
    other = await make_key()
    theirs = await saved_job(as_key=other)
    batch = {"prompt": ["a", "b", "c", "d"], "n": 2, "max_tokens": 1, "timeout_seconds": 30}
    async with serve(settings.model_copy(update={"team_max_waiting": 8})) as http:
        model = f"job-{ours['id']}@step-2"
        body = batch | {"model": model}
        requests = [asyncio.create_task(http.post("/v1/completions", json=body, headers=auth(key)))]
        await all_waiting(redis, queue_name, requests, tasks=4)
        refused = await http.post("/v1/chat/completions", json=chat(model), headers=auth(key))
        their_chat = chat(f"job-{theirs['id']}@step-2", timeout_seconds=30)
        post = http.post("/v1/chat/completions", json=their_chat, headers=auth(other))
        requests.append(asyncio.create_task(post))
        await all_waiting(redis, queue_name, requests, tasks=5)
        ended = [request for request in requests if request.done()]
        await withdrawn(requests)

    message = assert_openai_error(refused, 429, "rate_limit_error", "too_many_requests")
    assert "as it may (8, OPD_TEAM_MAX_WAITING)" in message
    assert refused.headers["retry-after"] == "5"
    assert not ended, "the other team's request waits in places of its own"


async def test_a_list_of_more_completions_than_a_team_may_have_waiting_is_a_400_saying_how_to_split(
    settings, key, saved_job, redis, queue_name
):
    job = await saved_job()
    body = {
        "model": f"job-{job['id']}@step-2",
        "prompt": ["a", "b", "c", "d", "e"],
        "n": 2,
        "max_tokens": 1,
        "timeout_seconds": 0.3,
    }
    async with serve(settings.model_copy(update={"team_max_waiting": 8})) as http:
        response = await http.post("/v1/completions", json=body, headers=auth(key))

    message = assert_openai_error(
        response, 400, "invalid_request_error", "too_many_completions", "prompt"
    )
    assert message == (
        "this request asks for 10 completions (5 prompts x n 2); a team may have at most 8 "
        "waiting for a worker at once (OPD_TEAM_MAX_WAITING): send them in requests of at "
        "most 8 completions each"
    )
    assert await redis.zcard(quick_queue(queue_name)) == 0


async def test_a_read_key_lists_models_and_may_not_sample_them(client, key, make_key, saved_job):
    job = await saved_job()
    reader = await make_key(key.team.name, scope=Scope.read)
    listed = await client.get("/v1/models", headers=auth(reader))
    refused = await client.post(
        "/v1/chat/completions", json=chat(f"job-{job['id']}@step-2"), headers=auth(reader)
    )

    assert listed.status_code == 200 and listed.json()["data"][0]["id"] == f"job-{job['id']}@step-2"
    message = assert_openai_error(refused, 403, "permission_error", "forbidden")
    assert "needs a key with the 'submit' scope" in message


async def test_other_routes_keep_the_services_error_shape(client, key):
    response = await client.get("/v1/jobs/999999", headers=auth(key))
    assert response.status_code == 404
    assert set(response.json()["error"]) == {"code", "message", "param"}


async def test_the_models_listed_are_the_teams_saved_weights(
    client, key, make_key, saved_job, session
):
    ours, theirs = await saved_job(), await saved_job(as_key=await make_key())
    await record_checkpoint(session, ours["id"], "w", 4, "final", "/w/4")
    listed = await client.get("/v1/models", headers=auth(key))
    one = await client.get(f"/v1/models/job-{ours['id']}:teacher", headers=auth(key))

    assert listed.status_code == 200, listed.text
    assert listed.json()["object"] == "list"
    models = listed.json()["data"]
    ids = [model["id"] for model in models]
    assert ids == [
        f"job-{ours['id']}{suffix}" for suffix in ("", ":teacher", ":base", "@step-2", "@step-4")
    ]
    assert all(
        model["object"] == "model" and model["owned_by"] == key.team.name for model in models
    )
    assert not any(
        model_id.startswith((f"job-{theirs['id']}:", f"job-{theirs['id']}@"))
        or model_id == f"job-{theirs['id']}"
        for model_id in ids
    )
    assert one.status_code == 200 and one.json()["id"] == f"job-{ours['id']}:teacher"


async def saved_steps(session, job_id: int, steps: range, kind: str = "sampler") -> None:
    """Sampler weights recorded after each step, as a job with `save_every: 1` records them."""
    rows = [
        {"job_id": job_id, "step": step, "kind": kind, "path": f"/w/{step}", "created_at": utcnow()}
        for step in steps
    ]
    await session.execute(insert(Checkpoint), rows)
    await session.commit()


async def pages_of(client, key, limit: int) -> list[dict[str, Any]]:
    """Every page of the models, each read after the previous one's `last_id`."""
    pages, params = [], {"limit": limit}
    while True:
        page = (await client.get("/v1/models", params=params, headers=auth(key))).json()
        pages.append(page)
        if not page["has_more"]:
            return pages
        params = {"limit": limit, "after": page["last_id"]}


async def test_models_come_in_pages_that_resume_after_the_last_id(
    client, key, make_key, saved_job, session
):
    older, newer = await saved_job(), await saved_job()
    await saved_job(as_key=await make_key())  # another team's, listed between them by id
    await saved_steps(session, older["id"], range(3, 6))
    await record_checkpoint(session, older["id"], "w", 4, "sampler", "/w/4-replayed")
    await record_checkpoint(session, older["id"], "w", 6, "final", "/w/6")
    whole = (await client.get("/v1/models", headers=auth(key))).json()
    ids = [model["id"] for model in whole["data"]]
    finals = [f"job-{older['id']}{role}" for role in ("", ":teacher", ":base")]
    steps = [f"job-{older['id']}@step-{step}" for step in range(2, 7)]
    assert ids == [f"job-{newer['id']}@step-2", *finals, *steps]
    assert (whole["first_id"], whole["last_id"], whole["has_more"]) == (ids[0], ids[-1], False)

    for limit in (1, 2, 3, 4):
        pages = await pages_of(client, key, limit)
        assert [model["id"] for page in pages for model in page["data"]] == ids
        assert all(len(page["data"]) == limit for page in pages[:-1])
        assert all(page["first_id"] == page["data"][0]["id"] for page in pages)

    refused = await client.get("/v1/models", params={"after": "gpt-4o"}, headers=auth(key))
    assert_openai_error(refused, 400, "invalid_request_error", "invalid_request", "after")
    beyond = {"after": "job-9999999999@step-999999"}  # no job has it, yet it names a place
    everything = await client.get("/v1/models", params=beyond, headers=auth(key))
    assert [model["id"] for model in everything.json()["data"]] == ids
    too_many = await client.get("/v1/models", params={"limit": 10_001}, headers=auth(key))
    assert_openai_error(too_many, 400, "invalid_request_error", "invalid_request", "limit")


async def test_a_page_of_models_reads_a_page_of_checkpoints(client, key, saved_job, session):
    job = await saved_job()
    await saved_steps(session, job["id"], range(3, 3_000))
    loaded = Counter[str]()

    def count(_checkpoint: Checkpoint, _context: Any) -> None:
        loaded["checkpoints"] += 1

    event.listen(Checkpoint, "load", count)
    try:
        page = await client.get("/v1/models", params={"limit": 10}, headers=auth(key))
        later = await client.get(
            "/v1/models",
            params={"limit": 10, "after": f"job-{job['id']}@step-2000"},
            headers=auth(key),
        )
    finally:
        event.remove(Checkpoint, "load", count)
    assert loaded["checkpoints"] <= 2 * 12, f"{loaded} loaded for two pages of 10"
    assert [model["id"] for model in later.json()["data"]][:2] == [
        f"job-{job['id']}@step-2001",
        f"job-{job['id']}@step-2002",
    ]
    assert page.json()["has_more"] and len(page.json()["data"]) == 10


async def test_a_spent_budget_is_a_rate_limit_error_with_the_budget_beside_it(
    client, key, make_key, saved_job, session, openai_client
):
    """Both OpenAI-form doors answer a spent budget as OpenAI's 429 (the `openai` package's
    RateLimitError), with the `budget` object every other door carries beside `error`."""
    job = await saved_job()
    await record_step(session, job["id"], "w", 0, usage(5, 5, 5))
    admin = await make_key(admin=True)
    await client.put(f"/v1/teams/{key.team.name}/budget", json={"tokens": 10}, headers=auth(admin))
    model = f"job-{job['id']}@step-2"
    calls = (
        lambda: openai_client.completions.create(model=model, prompt="hi", max_tokens=2),
        lambda: openai_client.chat.completions.create(model=model, messages=CHAT, max_tokens=2),
    )
    for call in calls:
        with pytest.raises(openai.RateLimitError) as refused:
            await call()
        body = refused.value.response.json()
        assert (body["error"]["type"], body["error"]["code"]) == (
            "rate_limit_error",
            "budget_exceeded",
        )
        assert (body["budget"]["spent"], body["budget"]["budget"]) == (15, 10), body
        assert (body["budget"]["team"], body["budget"]["unit"]) == (key.team.name, "tokens")
        assert int(refused.value.response.headers["Retry-After"]) > 0
