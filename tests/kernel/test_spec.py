"""The job spec: the reference scripts' defaults, bounds, and errors that name the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernel.spec import (
    DEFAULT_QUESTION_SUFFIX,
    JobSpec,
    SpecError,
    load_spec,
    parse_spec,
    unlisted_tracker,
)

EXAMPLES = sorted(
    path
    for path in (Path(__file__).parents[2] / "examples").glob("*.yaml")
    if not path.name.startswith("sweep-")  # sweeps, checked in tests/app/test_sweep_search.py
)


def test_defaults_are_the_reference_scripts_defaults():
    spec = JobSpec()
    assert (spec.student.base_model, spec.student.lora_rank, spec.student.seed) == (
        "Qwen/Qwen3.5-4B",
        32,
        42,
    )
    assert spec.teacher.base_model == "Qwen/Qwen3.6-27B" and spec.teacher.model_path is None
    assert (spec.dataset.source, spec.dataset.num_shards, spec.dataset.sample_size) == (
        "deepmath",
        1,
        1000,
    )
    assert spec.dataset.question_suffix == DEFAULT_QUESTION_SUFFIX
    assert spec.dataset.enable_thinking is False
    sampling = spec.sampling
    assert (sampling.max_tokens, sampling.temperature, sampling.top_p, sampling.top_k) == (
        512,
        1.0,
        1.0,
        -1,
    )
    assert (spec.optim.learning_rate, spec.optim.beta1, spec.optim.beta2) == (4e-5, 0.9, 0.95)
    loop = spec.loop
    assert (loop.steps, loop.batch_size, loop.group_size, loop.kl_penalty_coef) == (10, 2, 2, 1.0)
    assert (loop.loss_fn, loop.sampler_refresh_steps) == ("importance_sampling", 1)


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"loop": {"steps": 0}}, "loop.steps"),
        ({"student": {"lora_rank": 65}}, "student.lora_rank"),
        ({"sampling": {"top_k": 0}}, "sampling"),
        ({"loop": {"save_every": 3, "sampler_refresh_steps": 2}}, "loop"),
        ({"dataset": {"source": "inline", "prompts": []}}, "dataset.inline.prompts"),
        ({"optimizer": {}}, "optimizer"),
        ({"backend": "tinkr"}, "backend"),
        ({"tinker": {"timeout": 600}}, "tinker.timeout"),
        ({"tinker": {"call_timeout_seconds": 0}}, "tinker.call_timeout_seconds"),
        ({"tinker": {"call_attempts": 21}}, "tinker.call_attempts"),
        ({"trio": {"call_retry_delay_seconds": 0}}, "trio.call_retry_delay_seconds"),
        ({"student": {"init_from": {}}}, "student.init_from"),
        (
            {"student": {"init_from": {"job": 1, "checkpoint": "last"}}},
            "student.init_from.checkpoint",
        ),
        ({"student": {"init_from": {"job": 1, "checkpoint": -1}}}, "student.init_from.checkpoint"),
        ({"student": {"init_from": {"job": 0}}}, "student.init_from.job"),
    ],
)
def test_a_bad_spec_names_its_field(data, field):
    with pytest.raises(SpecError, match=rf"^{field}[.:]"):
        parse_spec(data)


def test_spec_files_are_yaml_or_json(tmp_path):
    (tmp_path / "a.yaml").write_text("name: a\nloop: {steps: 3}\n")
    (tmp_path / "b.json").write_text('{"name": "b", "loop": {"steps": 4}}')
    (tmp_path / "c.yaml").write_text("- not a mapping\n")
    assert load_spec(tmp_path / "a.yaml").loop.steps == 3
    assert load_spec(tmp_path / "b.json").loop.steps == 4
    with pytest.raises(SpecError, match="must be a mapping"):
        load_spec(tmp_path / "c.yaml")
    with pytest.raises(SpecError, match="cannot read spec"):
        load_spec(tmp_path / "missing.yaml")


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda path: path.name)
def test_every_example_spec_is_valid(example):
    assert load_spec(example).name


@pytest.mark.parametrize(
    ("uri", "problem"),
    [
        ("file:///etc", "http:// or https://"),
        ("sqlite:///mlflow.db", "http:// or https://"),
        ("http://", "http:// or https://"),
        ("https://user:secret@mlflow.example.com", "must not carry credentials"),
    ],
)
def test_an_mlflow_tracker_is_an_http_server_named_without_credentials(uri, problem):
    with pytest.raises(SpecError, match=r"trackers\.mlflow\.tracking_uri") as raised:
        parse_spec({"trackers": {"mlflow": {"tracking_uri": uri}}})
    assert problem in str(raised.value)


def test_only_the_listed_mlflow_servers_are_allowed():
    spec = parse_spec({"trackers": {"mlflow": {"tracking_uri": "http://mlflow:5000/"}}})
    assert spec.trackers.mlflow.experiment == "opd" and spec.trackers.mlflow.run_name is None
    assert unlisted_tracker(spec, ["http://mlflow:5000"]) is None
    assert "none are" in unlisted_tracker(spec, [])
    assert "http://other:5000" in unlisted_tracker(spec, ["http://other:5000"])
    assert unlisted_tracker(parse_spec({}), []) is None
