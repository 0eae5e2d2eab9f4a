"""Every integer, number and boolean a request body's JSON Schema documents takes only that
JSON type: `true` or `"1"` where it says integer (or number), 1 or `"true"` where it says
boolean, is a 4xx that names the field and says what it takes ("should be a whole number,
not true"). Lax validation read `true` as 1 and `"90"` as 90 (kernel/json_types.py).

The fields are found by walking each route's schema in the OpenAPI document along a valid
body of the route, and every such field the document has is reached by one of the bodies;
a JSON body route missing from the list, or a new group no body holds, fails the test.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from pydantic import BaseModel

from app.api.openai.completions import CompletionRequest
from app.api.openai.stored import MetadataUpdate
from app.api.openai.wire import ChatCompletionRequest
from app.auth.keys import NewKey
from app.auth.schemas import KeyCreate
from app.budgets.schemas import BudgetUpdate
from app.fine_tuning.schemas import FineTuningJobCreate
from app.main import create_app
from app.stored_completions.schemas import FeedbackCreate
from app.sweeps.schemas import SweepCreate
from app.teams.schemas import LimitsUpdate
from app.webhooks.schemas import WebhookCreate
from kernel.playground import SampleRequest
from kernel.spec import JobSpec
from kernel.wording import shown
from tests.app.conftest import MakeKey, auth
from tests.app.fuzzing import BASE, METRIC

Path = tuple[str | int, ...]
Schema = dict[str, Any]
SCALARS = {"integer", "number", "boolean"}

LOCAL_JOB: dict[str, Any] = {
    "name": "typed",
    "backend": "local",
    "priority": 1,
    "student": {
        "base_model": "tiny-student",
        "lora_rank": 16,
        "seed": 1,
        "init_from": {"job": 1, "checkpoint": 2, "with_optimizer": True},
    },
    "teacher": {"base_model": "tiny-teacher", "init_from": {"job": 1, "checkpoint": 3}},
    "dataset": {"source": "deepmath", "num_shards": 1, "sample_size": 10, "seed": 1},
    "sampling": {"max_tokens": 16, "temperature": 1.0, "top_p": 1.0, "top_k": -1},
    "optim": {"learning_rate": 1e-3, "beta1": 0.9, "eps": 1e-8, "grad_clip_norm": 1.0},
    "loop": {
        "steps": 4,
        "batch_size": 2,
        "save_every": 2,
        "loss_fn": "ppo",
        "loss_fn_config": {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2},
        "objective": {"kind": "reverse_kl", "top_k": 8, "tail": True},
        "reward": {"coef": 0.5},
        "cold_start": {"steps": 1, "source": "teacher"},
    },
    "eval": {"every": 2, "holdout": 1, "teacher_baseline": True},
    "local": {},
    "trio": {},
    "tinker": {},
    "swanlab": {},
    "trackers": {"mlflow": {"tracking_uri": "http://mlflow:5000"}},
}
"""A job spec with every group the reference's teacher and one dataset use."""
SERVER_JOB: dict[str, Any] = {
    "name": "typed",
    "backend": "trio",
    "student": {"base_model": "tiny-student"},
    "teacher": {
        "base_model": "tiny-teacher",
        "server": {"url": "http://vllm:8000/v1", "model": "m"},
    },
    "dataset": {"source": "file", "path": "train.jsonl"},
    "eval": {"dataset": {"source": "arithmetic"}},
}
"""A teacher on an inference server, a file's prompts, an eval dataset of its own."""
GATED_JOB: dict[str, Any] = {
    "name": "typed",
    "backend": "local",
    "student": {"base_model": "tiny-student"},
    "teacher": {"base_model": "tiny-teacher"},
    "dataset": {"source": "arithmetic"},
    "loop": {"sampler_correction": {"kind": "mask", "c": 3.0}},
}
"""The sampled objective with its trainer/sampler ratio bounded."""
MIXED_JOB: dict[str, Any] = {
    "name": "typed",
    "backend": "tinker",
    "student": {"base_model": "tiny-student"},
    "teachers": {
        "a": {"base_model": "tiny-teacher"},
        "b": {"base_model": "tiny-teacher"},
        "c": {"self": {"system": "Be brief.", "reference": False}},
    },
    "teacher_mixture": "mixture",
    "datasets": [
        {"source": "inline", "name": "i", "prompts": ["What is 1 + 1?"]},
        {"source": "deepmath", "name": "d"},
        {"source": "file", "name": "f", "path": "x.jsonl"},
        {"source": "arithmetic", "name": "r"},
        {
            "source": "stored_completions",
            "name": "s",
            "weight": 1.0,
            "enable_thinking": False,
            "filter": {"rating": -1, "has_feedback": True, "limit": 10},
        },
    ],
    "loop": {"batch_size": 5},
    "eval": {"dataset": {"source": "inline", "prompts": ["What is 2 + 2?"]}},
}
"""Several teachers (one the student itself) and datasets, one of each source; prompts of
its own to evaluate on."""
FEEDBACK_JOB: dict[str, Any] = {
    "backend": "local",
    "student": {"base_model": "tiny-student"},
    "teacher": {"self": {"context": "feedback"}},
    "dataset": {"source": "stored_completions", "enable_thinking": False},
}
"""A self teacher reading the feedback on the team's stored completions."""
SWEEP: dict[str, Any] = {
    "name": "typed",
    "parameters": {"optim.learning_rate": {"min": 1e-4, "max": 1e-2}},
    "method": "random",
    "metric": {"name": METRIC, "goal": "minimize"},
    "max_trials": 2,
    "parallel": 1,
    "seed": 0,
    "early_stop": {"type": "asha", "min_steps": 1, "eta": 2},
}
"""A sweep, but for its base."""
TOOL = {
    "type": "function",
    "function": {"name": "add", "parameters": {"type": "object"}, "strict": True},
}
TOOL_CHAT = [
    {"role": "user", "content": "Hi"},
    {
        "role": "assistant",
        "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "add", "arguments": "{}"}}
        ],
        "weight": 1,
    },
    {"role": "tool", "tool_call_id": "c", "content": "3"},
]
"""A chat with a tool's call and its reply, and the tool it calls."""
MODEL = "job-{job}"
"""The OpenAI routes' model: the test's job (filled in per test)."""
PLAYGROUND = [
    {"prompt": "Hi", "n": 1, "max_tokens": 4, "temperature": 1.0, "top_p": 1.0},
    {
        "prompt_token_ids": [5],
        "prompt_logprobs": True,
        "top_logprobs": 1,
        "checkpoint": 1,
        "seed": 1,
        "timeout_seconds": 5.0,
    },
]
"""Playground requests: a prompt, and token ids with every option."""
BODIES: dict[str, tuple[type[BaseModel], list[dict[str, Any]]]] = {
    "POST /v1/jobs": (JobSpec, [LOCAL_JOB, SERVER_JOB, GATED_JOB, MIXED_JOB, FEEDBACK_JOB]),
    "POST /v1/jobs/{job_id}/playground": (SampleRequest, PLAYGROUND),
    "POST /v1/jobs/{job_id}/sample": (SampleRequest, PLAYGROUND),  # its old name
    "POST /v1/sweeps": (SweepCreate, [SWEEP | {"base_job": 1}]),
    "POST /v1/jobs/estimate": (JobSpec, [LOCAL_JOB]),
    "POST /v1/sweeps/estimate": (SweepCreate, [SWEEP | {"base_job": 1}]),
    "PUT /v1/teams/{team}/budget": (BudgetUpdate, [{"tokens": 1000, "soft": 0.8}]),
    "POST /v1/chat/completions": (
        ChatCompletionRequest,
        [
            {
                "model": MODEL,
                "messages": TOOL_CHAT,
                "tools": [TOOL],
                "tool_choice": "auto",
                "max_tokens": 4,
                "max_completion_tokens": 4,
                "temperature": 1.0,
                "top_p": 1.0,
                "n": 1,
                "seed": 1,
                "logprobs": True,
                "top_logprobs": 0,
                "frequency_penalty": 0.0,
                "presence_penalty": 0.0,
                "stream": True,
                "stream_options": {"include_usage": True},
                "timeout_seconds": 5.0,
                "store": True,
                "metadata": {"a": "b"},
            }
        ],
    ),
    "POST /v1/chat/completions/{completion_id}": (MetadataUpdate, [{"metadata": {"a": "b"}}]),
    "POST /v1/chat/completions/{completion_id}/feedback": (
        FeedbackCreate,
        [{"rating": 1, "correction": "Answer with the number only", "author": "ana"}],
    ),
    "POST /v1/fine_tuning/jobs": (
        FineTuningJobCreate,
        [
            {
                "model": "arith-student",
                "training_file": "file-1",
                "validation_file": "file-1",
                "suffix": "typed",
                "seed": 1,
                "metadata": {"a": "b"},
                "hyperparameters": {
                    "n_epochs": 1,
                    "batch_size": 2,
                    "learning_rate_multiplier": 0.5,
                },
                "method": {
                    "type": "distillation",
                    "distillation": {"teacher": {"base_model": "arith-teacher"}},
                },
            }
        ],
    ),
    "POST /v1/completions": (
        CompletionRequest,
        [
            {
                "model": MODEL,
                "prompt": [5],
                "max_tokens": 4,
                "temperature": 1.0,
                "top_p": 1.0,
                "n": 1,
                "best_of": 1,
                "seed": 1,
                "echo": True,
                "logprobs": 1,
                "prompt_logprobs": 1,
                "frequency_penalty": 0.0,
                "presence_penalty": 0.0,
                "timeout_seconds": 5.0,
                "store": True,
            },
            {"model": MODEL, "prompt": [[5]]},
        ],
    ),
    "POST /v1/keys": (KeyCreate, [{"team": "typed", "expires_in_days": 30}]),
    "PATCH /v1/teams/{name}": (LimitsUpdate, [{"max_running": 2, "max_queued": 4}]),
    "POST /v1/webhooks": (
        WebhookCreate,
        [{"url": "https://hooks.example.com/opd", "events": ["job.succeeded"]}],
    ),
}
"""A valid body of each route with a JSON body, by route; together they hold every group
of fields the document describes."""
UNTYPED = {
    "POST /v1/jobs/{job_id}/clone": {"loop": {"steps": 4}},
    "POST /v1/sweeps base": SWEEP | {"base": BASE},
}
"""Bodies whose schema leaves a part untyped (a merge patch of a spec, a sweep's base), read
as a job spec afterwards: the same refusal, at the field's path."""


def document() -> Schema:
    return create_app().openapi()


def resolved(schema: Schema, components: Schema) -> Schema:
    while "$ref" in schema:
        schema = components[schema["$ref"].rsplit("/", 1)[-1]]
    return schema


def members(schema: Schema, components: Schema, value: Any = None) -> list[Schema]:
    """The schemas a value may match: those in anyOf / oneOf, resolved (the one a dict
    `value` names by a discriminator), else the schema itself."""
    schema = resolved(schema, components)
    discriminator = schema.get("discriminator")
    if discriminator and isinstance(value, dict) and discriminator["propertyName"] in value:
        tag = value[discriminator["propertyName"]]
        return [resolved({"$ref": discriminator["mapping"][tag]}, components)]
    alternatives = schema.get("anyOf") or schema.get("oneOf")
    if not alternatives or "properties" in schema:
        return [schema]
    return [m for alt in alternatives for m in members(alt, components, value)]


def json_types(schemas: list[Schema]) -> set[str]:
    return {s["type"] for s in schemas if isinstance(s.get("type"), str)}


def wrong_values(types: set[str]) -> list[Any]:
    """Values of other JSON types that lax validation would read as one of `types`."""
    wrong: list[Any] = []
    if types & {"integer", "number"}:
        wrong += [True] if "boolean" not in types else []
        wrong += ["1"] if "string" not in types else []
    elif "boolean" in types:
        wrong += [1, "true"] if "string" not in types else [1]
    return wrong


def object_schema(value: dict[str, Any], schema: Schema, components: Schema) -> Schema | None:
    """The member of `schema` that an object `value` is: the one its discriminator names,
    else the first whose properties hold the value's keys."""
    for member in members(schema, components, value):
        if member.get("type") == "object" and set(value) <= set(member.get("properties", {})):
            return member
    return None


def values_schema(schema: Schema, components: Schema) -> Schema | None:
    """The schema of a mapping's values (patternProperties or additionalProperties)."""
    for member in members(schema, components):
        patterns = list(member.get("patternProperties", {}).values())
        if patterns:
            return patterns[0]
        if isinstance(member.get("additionalProperties"), dict):
            return member["additionalProperties"]
    return None


def planted(
    value: Any, schema: Schema, components: Schema, at: Path = ()
) -> Iterator[tuple[Path, Any, str]]:
    """(path, wrong value, "Component.field") for every integer, number and boolean field
    of `value`'s schema, given or not, under every object and list `value` holds."""
    if isinstance(value, dict):
        found = object_schema(value, schema, components)
        if found is None or "properties" not in found:
            inner = values_schema(schema, components)
            for key, item in value.items():
                if inner is not None:
                    yield from planted(item, inner, components, (*at, key))
            return
        for name, field in found["properties"].items():
            options = members(field, components)
            for wrong in wrong_values(json_types(options)):
                yield (*at, name), wrong, f"{found['title']}.{name}"
            if name in value:
                yield from planted(value[name], field, components, (*at, name))
    elif isinstance(value, list) and value:
        lists = [m for m in members(schema, components) if m.get("type") == "array"]
        items = [i for m in lists for i in members(m.get("items", {}), components)]
        for wrong in wrong_values(json_types(items)):
            if not isinstance(value[0], dict | list):
                yield (*at, 0), wrong, "items"
        for index, item in enumerate(value):
            if isinstance(item, dict | list):
                inner = {"anyOf": [m.get("items", {}) for m in lists]}
                yield from planted(item, inner, components, (*at, index))


def with_value(body: Any, path: Path, value: Any) -> Any:
    changed = copy.deepcopy(body)
    node = changed
    for part in path[:-1]:
        node = node.setdefault(part, {}) if isinstance(node, dict) else node[part]
    node[path[-1]] = value
    return changed


def documented_fields(schema: Schema) -> set[str]:
    """Every "Component.field" of a request body's schema that is an integer, a number or
    a boolean."""
    components = schema["components"]["schemas"]
    pending = [
        op["requestBody"]
        for path in schema["paths"].values()
        for op in path.values()
        if "requestBody" in op
    ]
    seen: set[str] = set()
    while pending:
        node = pending.pop()
        if isinstance(node, dict):
            ref = node.get("$ref", "")
            name = ref.rsplit("/", 1)[-1]
            if name and name not in seen:
                seen.add(name)
                pending.append(components[name])
            pending.extend(node.values())
        elif isinstance(node, list):
            pending.extend(node)
    return {
        f"{name}.{field}"
        for name in seen
        for field, property_schema in components[name].get("properties", {}).items()
        if wrong_values(json_types(members(property_schema, components)))
    }


def filled(body: Any, job: int) -> Any:
    return json.loads(json.dumps(body).replace(json.dumps(MODEL), json.dumps(f"job-{job}")))


def test_the_bodies_are_valid_and_reach_every_documented_field() -> None:
    """The list covers every JSON body route, each body is valid, and the bodies reach every
    integer, number and boolean field of the document (a new one is then tested too)."""
    schema = document()
    components = schema["components"]["schemas"]
    routes = {
        f"{method.upper()} {path}"
        for path, operations in schema["paths"].items()
        for method, operation in operations.items()
        if "application/json" in operation.get("requestBody", {}).get("content", {})
    }
    assert routes == set(BODIES) | {"POST /v1/jobs/{job_id}/clone"}
    reached = set()
    for route, (model, bodies) in BODIES.items():
        path, method = route.split(" ")[1], route.split(" ")[0].lower()
        body_schema = schema["paths"][path][method]["requestBody"]["content"]["application/json"][
            "schema"
        ]
        for body in bodies:
            model.model_validate(filled(body, 1))
            reached |= {field for _, _, field in planted(body, body_schema, components)}
    missing = documented_fields(schema) - reached
    assert not missing, f"no body of BODIES holds the group of {sorted(missing)}"


async def refusals(
    client: httpx.AsyncClient,
    key: NewKey,
    route: str,
    job: int,
    body: Any,
    cases: list[tuple[Path, Any]],
) -> list[str]:
    """What is wrong with each case's answer (none: a 4xx naming the field and the value)."""
    method, template = route.split(" ")[:2]
    url = template.format(
        job_id=job, name=key.team.name, team=key.team.name, completion_id="chatcmpl-none"
    )
    wrong = []
    for path, value in cases:
        sent = with_value(filled(body, job), path, value)
        response = await client.request(method, url, json=sent, headers=auth(key))
        error = (
            response.json().get("error", {})
            if response.headers.get("content-type") == "application/json"
            else {}
        )
        field = ".".join(str(part) for part in path)
        expected = f"{field}: should be "
        if not (
            400 <= response.status_code < 500
            and error.get("param") == field
            and expected in error.get("message", "")
            and f"not {shown(value)}" in error.get("message", "")
        ):
            wrong.append(
                f"{route} {field}={json.dumps(value)}: {response.status_code} {response.text[:300]}"
            )
    return wrong


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize("route", list(BODIES))
async def test_a_value_of_another_json_type_is_refused_naming_the_field(
    route: str, client: httpx.AsyncClient, make_key: MakeKey, job_ids: dict[str, int]
) -> None:
    schema = document()
    components = schema["components"]["schemas"]
    path, method = route.split(" ")[1], route.split(" ")[0].lower()
    body_schema = schema["paths"][path][method]["requestBody"]["content"]["application/json"][
        "schema"
    ]
    key = await make_key(admin=True)
    job = job_ids["own-job"]
    wrong = []
    for body in BODIES[route][1]:
        cases = [(at, value) for at, value, _ in planted(body, body_schema, components)]
        wrong += await refusals(client, key, route, job, body, cases)
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize(
    ("route", "path"),
    [
        ("POST /v1/jobs/{job_id}/clone", ("loop", "steps")),
        ("POST /v1/sweeps base", ("base", "loop", "steps")),
        ("POST /v1/sweeps base", ("base", "eval", "teacher_baseline")),
    ],
)
async def test_a_spec_read_from_an_untyped_part_refuses_them_too(
    route: str, path: Path, client: httpx.AsyncClient, make_key: MakeKey, job_ids: dict[str, int]
) -> None:
    key = await make_key(admin=True)
    body = UNTYPED[route]
    values = [1, "true"] if path[-1] == "teacher_baseline" else [True, "1"]
    wrong = await refusals(
        client,
        key,
        route.removesuffix(" base"),
        job_ids["own-job"],
        body,
        [(path, v) for v in values],
    )
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
async def test_a_whole_number_written_with_a_fraction_is_still_an_integer(
    client: httpx.AsyncClient, make_key: MakeKey
) -> None:
    """JSON Schema's integer is a number without a fraction: 12.0 is one (Python's json
    writes a computed count so)."""
    admin = await make_key(admin=True)
    created = await client.post(
        "/v1/keys", json={"team": "whole", "expires_in_days": 12.0}, headers=auth(admin)
    )
    assert created.status_code == 201, created.text
    spec = copy.deepcopy(BASE)
    spec["loop"] = spec["loop"] | {"steps": 4.0}
    submitted = await client.post("/v1/jobs", json=spec, headers=auth(admin))
    assert submitted.status_code == 201, submitted.text
    assert submitted.json()["spec"]["loop"]["steps"] == 4
