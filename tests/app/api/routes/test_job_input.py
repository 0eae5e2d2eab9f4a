"""Input limits of POST /v1/jobs: bounded specs, no unknown fields, dataset files confined to
the data root. Each refusal is a 422 naming the field, and nothing is stored or queued."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis

from kernel.spec.base import MAX_STEPS
from kernel.spec.data import MAX_INLINE_PROMPTS
from kernel.spec.job import MAX_METADATA_KEY_CHARS, MAX_METADATA_KEYS, MAX_METADATA_VALUE_CHARS
from kernel.spec.loop import MAX_BATCH_SIZE, MAX_GROUP_SIZE
from kernel.spec.sampling import MAX_TOKENS
from tests.app.conftest import auth, small_spec


async def refused(client, key, redis: Redis, queue_name: str, body: dict[str, Any]) -> dict:
    """POST `body`, expect a 422, check nothing was stored or queued; the error body."""
    response = await client.post("/v1/jobs", json=body, headers=auth(key))
    assert response.status_code == 422, response.text
    listed = await client.get("/v1/jobs", headers=auth(key))
    assert listed.json()["data"] == []
    assert await redis.zcard(queue_name) == 0
    error = response.json()["error"]
    assert error["code"] == "invalid_request"
    return error


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (small_spec(loop={"steps": MAX_STEPS + 1}), "loop.steps"),
        (small_spec(loop={"batch_size": 0}), "loop.batch_size"),
        (small_spec(loop={"batch_size": MAX_BATCH_SIZE + 1}), "loop.batch_size"),
        (small_spec(loop={"group_size": 0}), "loop.group_size"),
        (small_spec(loop={"group_size": MAX_GROUP_SIZE + 1}), "loop.group_size"),
        (small_spec(sampling={"max_tokens": 0}), "sampling.max_tokens"),
        (small_spec(sampling={"max_tokens": MAX_TOKENS + 1}), "sampling.max_tokens"),
        (
            small_spec(metadata={f"k{i}": "v" for i in range(MAX_METADATA_KEYS + 1)}),
            "metadata",
        ),
        (small_spec(metadata={"k": "v" * (MAX_METADATA_VALUE_CHARS + 1)}), "metadata.k"),
        (
            small_spec(dataset={"source": "inline", "prompts": ["x"] * (MAX_INLINE_PROMPTS + 1)}),
            "dataset.prompts",
        ),
    ],
)
async def test_spec_bounds_are_422s_naming_the_field(
    client, key, redis, queue_name, body, param
) -> None:
    error = await refused(client, key, redis, queue_name, body)
    assert error["param"] == param
    assert error["message"].startswith(f"{param}: ")


async def test_a_metadata_key_is_bounded(client, key, redis, queue_name) -> None:
    long_key = "k" * (MAX_METADATA_KEY_CHARS + 1)
    error = await refused(client, key, redis, queue_name, small_spec(metadata={long_key: "v"}))
    assert error["param"] == f"metadata.{long_key}"
    assert f"this key should have at most {MAX_METADATA_KEY_CHARS} characters" in error["message"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (small_spec(urgency=1), "urgency"),
        (small_spec(sampling={"max_tokens": 8, "beam_width": 4}), "sampling.beam_width"),
        (
            small_spec(dataset={"source": "inline", "prompts": ["x"], "shuffle": True}),
            "dataset.shuffle",
        ),
    ],
)
async def test_unknown_fields_are_refused(client, key, redis, queue_name, body, param) -> None:
    error = await refused(client, key, redis, queue_name, body)
    assert error["param"] == param
    assert error["message"] == f"{param}: unknown field"


@pytest.mark.parametrize(
    ("body", "param", "meant"),
    [
        (small_spec(loop={"stesp": 3}), "loop.stesp", "`loop.steps`"),
        (small_spec(steps=3), "steps", "`loop.steps`"),
        (small_spec(optim={"learning_rat": 1e-4}), "optim.learning_rat", "`optim.learning_rate`"),
        (
            small_spec(temperature=0.7),
            "temperature",
            "`sampling.temperature` or `eval.temperature`",
        ),
        (
            small_spec(dataset={"source": "inline", "prompts": ["x"], "answer": ["y"]}),
            "dataset.answer",
            "`dataset.answers`",
        ),
    ],
)
async def test_a_misspelt_field_is_refused_with_the_field_it_likely_meant(
    client, key, redis, queue_name, body, param, meant
) -> None:
    """Before: `loop.stesp: Extra inputs are not permitted`."""
    error = await refused(client, key, redis, queue_name, body)
    assert error["param"] == param
    assert error["message"] == f"{param}: unknown field; did you mean {meant}?"


@pytest.mark.parametrize(
    ("body", "param", "message"),
    [
        (small_spec(loop={"steps": "ten"}), "loop.steps", 'should be a whole number, not "ten"'),
        (small_spec(loop=[3]), "loop", "should be a mapping of fields, not a list"),
        (
            small_spec(backend="gpu"),
            "backend",
            "should be 'local', 'trio' or 'tinker', not \"gpu\"",
        ),
        (
            small_spec(dataset={"source": "csv"}),
            "dataset.source",
            "should be 'deepmath', 'file', 'inline', 'arithmetic' or 'stored_completions', "
            'not "csv"',
        ),
        (
            small_spec(dataset={"prompts": ["x"]}),
            "dataset.source",
            "this field is required: 'deepmath', 'file', 'inline', 'arithmetic' or "
            "'stored_completions'",
        ),
        (small_spec(sampling={"top_k": 0}), "sampling.top_k", "must be -1 (off) or >= 1"),
        (
            small_spec(dataset={"source": "inline", "prompts": ["x"], "answers": []}),
            "dataset.answers",
            "has 0 entries for 1 prompts",
        ),
    ],
)
async def test_a_refusal_names_the_field_as_written_in_words_without_python_types(
    client, key, redis, queue_name, body, param, message
) -> None:
    """Before: `loop: Input should be a valid dictionary or instance of LoopSpec`, `dataset:
    Unable to extract tag using discriminator 'source'`, `sampling: Value error, top_k must
    be -1 (off) or >= 1`; a union's tag in the path (`dataset.inline.answers`)."""
    error = await refused(client, key, redis, queue_name, body)
    assert error["param"] == param
    assert error["message"] == f"{param}: {message}"


def file_spec(path: str) -> dict[str, Any]:
    return small_spec(dataset={"source": "file", "path": path})


@pytest.fixture
def data_root(settings) -> Path:
    settings.data_root.mkdir(parents=True)
    return settings.data_root


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    secret = tmp_path / "secret" / "math.jsonl"
    secret.parent.mkdir()
    secret.write_text('{"question": "private"}\n')
    return secret


async def test_dataset_paths_outside_the_data_root_are_refused_before_storing(
    client, key, redis, queue_name, data_root: Path, outside: Path
) -> None:
    (data_root / "link.jsonl").symlink_to(outside)
    (data_root / "linkdir").symlink_to(outside.parent, target_is_directory=True)
    escapes = {
        "../secret/math.jsonl": "points outside the server's data root; upload the file",
        "sub/../../secret/math.jsonl": "points outside",
        str(outside): "points outside",
        "link.jsonl": "points outside",
        "linkdir/math.jsonl": "points outside",
        "bad\0name.jsonl": "cannot be used: embedded null byte",
    }
    for path, reason in escapes.items():
        error = await refused(client, key, redis, queue_name, file_spec(path))
        assert error["param"] == "dataset.path", path
        assert error["message"].startswith("dataset.path: "), path
        assert reason in error["message"], path


async def test_dataset_paths_inside_the_data_root_are_accepted(
    client, key, data_root: Path
) -> None:
    (data_root / "a").mkdir()
    (data_root / "a" / "math.jsonl").write_text('{"question": "inside"}\n')
    (data_root / "alias.jsonl").symlink_to(data_root / "a" / "math.jsonl")
    inside = [
        "a/math.jsonl",
        "a/../a/math.jsonl",
        str(data_root / "a" / "math.jsonl"),
        "alias.jsonl",
        "not/uploaded/yet.jsonl",
    ]
    for path in inside:
        response = await client.post("/v1/jobs", json=file_spec(path), headers=auth(key))
        assert response.status_code == 201, (path, response.text)
        assert response.json()["spec"]["dataset"]["path"] == path


async def test_mlflow_servers_other_than_the_operators_are_refused_before_storing(
    client, key, redis, queue_name, settings
) -> None:
    """A spec may not make the service call an address it names: only listed servers."""
    settings.mlflow_tracking_uris = ["http://mlflow.internal:5000"]
    tracker = {"mlflow": {"tracking_uri": "http://169.254.169.254/latest"}}
    error = await refused(client, key, redis, queue_name, small_spec(trackers=tracker))
    assert error["param"] == "trackers.mlflow.tracking_uri"
    assert "http://mlflow.internal:5000" in error["message"]
    assert "OPD_MLFLOW_TRACKING_URIS" in error["message"]

    listed = {"mlflow": {"tracking_uri": "http://mlflow.internal:5000/", "experiment": "e"}}
    response = await client.post("/v1/jobs", json=small_spec(trackers=listed), headers=auth(key))
    assert response.status_code == 201, response.text
    assert response.json()["spec"]["trackers"]["mlflow"]["experiment"] == "e"
    assert response.json()["mlflow_run_id"] is None
