"""The job spec: the reference scripts' defaults, bounds, and errors that name the field."""

from __future__ import annotations

import json
import math
import typing
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel

from kernel.merge_patch import dotted_patch, merge_patch
from kernel.spec import JobSpec, SpecError, load_spec, parse_spec
from kernel.spec.checks import unlisted_tracker
from kernel.spec.data import DEFAULT_QUESTION_SUFFIX
from tests.support import REFERENCE_NAMES, named

EXAMPLES = sorted(
    path
    for path in (Path(__file__).parents[2] / "examples").glob("*.yaml")
    if not path.name.startswith("sweep-")  # sweeps, checked in tests/app/sweeps/test_search.py
)


def test_defaults_are_the_reference_scripts_defaults():
    spec = JobSpec.model_validate(named({}))
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
        ({"dataset": {"source": "inline", "prompts": []}}, "dataset.prompts"),
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
        parse_spec(named(data))


def test_spec_files_are_yaml_or_json(tmp_path):
    (tmp_path / "a.yaml").write_text(yaml.safe_dump(named({"name": "a", "loop": {"steps": 3}})))
    (tmp_path / "b.json").write_text(json.dumps(named({"name": "b", "loop": {"steps": 4}})))
    (tmp_path / "c.yaml").write_text("- not a mapping\n")
    assert load_spec(tmp_path / "a.yaml").loop.steps == 3
    assert load_spec(tmp_path / "b.json").loop.steps == 4
    with pytest.raises(SpecError, match="must be a mapping"):
        load_spec(tmp_path / "c.yaml")
    with pytest.raises(SpecError, match="cannot read spec"):
        load_spec(tmp_path / "missing.yaml")


def test_a_spec_file_that_is_no_yaml_names_the_file_and_the_line(tmp_path):
    """Before: `... is not valid YAML/JSON: mapping values are not allowed here in
    "<unicode string>", line 3, column 8`."""
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: x\nloop:\n  steps: 3: 4\n")
    with pytest.raises(SpecError) as refused:
        load_spec(broken)
    assert str(refused.value) == (
        f"{broken}, line 3: not valid YAML: mapping values are not allowed here"
    )
    unclosed = tmp_path / "unclosed.json"
    unclosed.write_text('{\n  "name": "x",\n  "loop": {"steps": 3\n}\n')
    with pytest.raises(SpecError, match=rf"^{unclosed}, line 5: not valid JSON: Expecting"):
        load_spec(unclosed)


def test_an_empty_spec_file_says_so(tmp_path):
    """Before: `a spec must be a mapping of groups, got NoneType`."""
    (tmp_path / "empty.yaml").write_text("# nothing yet\n")
    with pytest.raises(SpecError) as refused:
        load_spec(tmp_path / "empty.yaml")
    assert str(refused.value) == (
        f"{tmp_path / 'empty.yaml'}: a spec is empty: it must be a mapping of fields "
        "(`name: value` lines)"
    )
    assert "NoneType" not in str(refused.value)


def test_a_spec_files_problems_name_their_lines(tmp_path):
    spec = named({"loop": {"steps": 3}})
    text = yaml.safe_dump(spec, sort_keys=False).replace("steps: 3", "stesp: 3")
    path = tmp_path / "misspelt.yaml"
    path.write_text(text)
    line = text.splitlines().index("  stesp: 3") + 1
    with pytest.raises(SpecError) as refused:
        load_spec(path)
    assert str(refused.value) == (
        f"{path}, line {line}: loop.stesp: unknown field; did you mean `loop.steps`?"
    )
    assert refused.value.problems == [("loop.stesp", "unknown field; did you mean `loop.steps`?")]


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
        parse_spec(named({"trackers": {"mlflow": {"tracking_uri": uri}}}))
    assert problem in str(raised.value)


def test_only_the_listed_mlflow_servers_are_allowed():
    spec = parse_spec(named({"trackers": {"mlflow": {"tracking_uri": "http://mlflow:5000/"}}}))
    assert spec.trackers.mlflow.experiment == "opd" and spec.trackers.mlflow.run_name is None
    assert unlisted_tracker(spec, ["http://mlflow:5000"]) is None
    assert "none are" in unlisted_tracker(spec, [])
    assert "http://other:5000" in unlisted_tracker(spec, ["http://other:5000"])
    assert unlisted_tracker(parse_spec(named({})), []) is None


def test_a_spec_names_what_it_trains():
    with pytest.raises(SpecError) as empty:
        parse_spec({})
    assert [path for path, _ in empty.value.problems] == [
        "backend",
        "student",
        "teacher",
        "dataset",
    ]
    with pytest.raises(SpecError, match=r"^student\.base_model: this field is required"):
        parse_spec(named({"student": {"lora_rank": 8}}) | {"student": {"lora_rank": 8}})
    with pytest.raises(SpecError, match=r"^teachers\.a\.base_model: this field is required"):
        parse_spec(named({"teachers": {"a": {"weight": 2}}}))


def test_the_reference_job_is_an_example_file():
    reference = load_spec(Path(__file__).parents[2] / "examples" / "deepmath-trio.yaml")
    assert reference.backend == REFERENCE_NAMES["backend"]
    assert reference.student.base_model == REFERENCE_NAMES["student"]["base_model"]
    assert reference.teacher.base_model == REFERENCE_NAMES["teacher"]["base_model"]
    assert reference.dataset.source == REFERENCE_NAMES["dataset"]["source"]


def float_fields(model: type[BaseModel], prefix: str = "") -> list[str]:
    """The dotted path of every float field under `model`'s groups (not inside unions)."""
    paths = []
    for name, field in model.model_fields.items():
        kinds = typing.get_args(field.annotation) or (field.annotation,)
        for kind in kinds:
            if kind is float:
                paths.append(f"{prefix}{name}")
            elif isinstance(kind, type) and issubclass(kind, BaseModel):
                paths.extend(float_fields(kind, f"{prefix}{name}."))
    return paths


FLOAT_FIELDS = float_fields(JobSpec)


def test_every_float_field_is_found():
    some = {"optim.grad_clip_norm", "loop.loss_fn_config.beta", "trio.call_retry_delay_seconds"}
    assert some <= set(FLOAT_FIELDS)


def with_value(path: str, value: float) -> dict[str, object]:
    """A valid spec but for `value` at `path` (a loss whose options `path` may set)."""
    loss = "dro" if path.endswith(".beta") else "ppo"
    patch = {"loop": {"loss_fn": loss}}
    if path.startswith("teacher.server."):  # a server needs its url and model
        patch["teacher"] = {"server": {"url": "http://teacher:8000/v1", "model": "m"}}
    return named(merge_patch(patch, dotted_patch({path: value})))


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan], ids=str)
@pytest.mark.parametrize("path", FLOAT_FIELDS)
def test_every_float_field_refuses_a_non_finite_number(path, value):
    """JSON has no NaN or Infinity (Postgres refuses them in a JSON column); Python's json
    and YAML's .inf / .nan make them."""
    with pytest.raises(SpecError) as refused:
        parse_spec(with_value(path, value))
    assert refused.value.problems == [(path, "should be a finite number")]


@pytest.mark.parametrize("value", [math.inf, math.nan], ids=str)
def test_a_teachers_or_a_datasets_weight_refuses_a_non_finite_number(value):
    teachers = {"a": {"base_model": "org/a", "weight": value}}
    datasets = [{"name": "d", "source": "inline", "prompts": ["q"], "weight": value}]
    for groups, path in (
        ({"teachers": teachers}, "teachers.a.weight"),
        ({"datasets": datasets}, "datasets.0.weight"),
    ):
        with pytest.raises(SpecError) as refused:
            parse_spec(named(groups))
        assert refused.value.problems == [(path, "should be a finite number")]


def test_the_objective_defaults_to_the_reference_and_takes_a_name_alone():
    assert JobSpec.model_validate(named({})).loop.objective.kind == "sampled_reverse_kl"
    assert not JobSpec.model_validate(named({})).loop.objective.logit_level
    objective = parse_spec(named({"backend": "local", "loop": {"objective": "jsd"}})).loop.objective
    assert (objective.kind, objective.mixture_weight, objective.top_k) == ("jsd", 0.5, 0)
    stored = parse_spec(named({"backend": "local", "loop": {"objective": "jsd"}})).model_dump()
    assert parse_spec(stored).loop.objective == objective


@pytest.mark.parametrize(
    ("objective", "loop", "field", "says"),
    [
        ({"kind": "sampled_reverse_kl", "top_k": 8}, {}, "loop.objective.top_k", "sampled token"),
        ({"kind": "reverse_kl", "beta": 0.5}, {}, "loop.objective.beta", "jsd's"),
        ({"kind": "forward_kl", "tail": False}, {}, "loop.objective.tail", "top_k >= 1"),
        ({"kind": "jsd", "beta": 1.5}, {}, "loop.objective.beta", "less than or equal"),
        ({"kind": "forward_kl", "top_k": 2000}, {}, "loop.objective.top_k", "less than"),
        ("reverse_kl", {"kl_discount_factor": 0.9}, "loop.kl_discount_factor", "discounting"),
        ("forward_kl", {"loss_fn": "ppo"}, "loop.loss_fn", "reward.coef is 0"),
    ],
)
def test_an_objective_that_makes_no_sense_is_refused_at_its_field(objective, loop, field, says):
    data = named({"backend": "local", "loop": {"objective": objective, **loop}})
    with pytest.raises(SpecError, match=rf"^{field}: .*{says}"):
        parse_spec(data)


@pytest.mark.parametrize(
    ("student", "teacher"),
    [
        ("arith-student", "arith-teacher-bpe"),
        ("smollm2-135m-instruct", "tiny-teacher"),
        ("arith-student", "smollm2-135m-instruct"),
    ],
)
def test_a_logit_objective_with_a_teacher_over_another_tokenizer_is_refused_in_a_mixture(
    student, teacher
):
    """A teacher over another tokenizer (arith-teacher-bpe's BPE, SmolLM2's 49,152 tokens
    against the byte-level presets) is compared over the next byte: alone or routed, but
    not in a mixture, whose teachers' token boundaries fall apart."""
    models = {"backend": "local", "student": {"base_model": student}}
    alone = models | {"teacher": {"base_model": teacher}, "loop": {"objective": "jsd"}}
    assert parse_spec(named(alone)).loop.objective.kind == "jsd"
    mixed = models | {
        "teachers": {"other": {"base_model": teacher}, "own": {"base_model": student}},
        "teacher_mixture": "mixture",
        "loop": {"objective": "reverse_kl"},
    }
    with pytest.raises(SpecError, match=r"^teacher_mixture: .*another tokenizer"):
        parse_spec(named(mixed))
    assert parse_spec(named(mixed | {"loop": {}})).loop.objective.kind == "sampled_reverse_kl"


@pytest.mark.parametrize(
    ("backend", "objective", "extra", "field"),
    [
        ("trio", "reverse_kl", {}, "loop.objective.kind"),
        ("trio", {"kind": "forward_kl", "top_k": 20, "tail": False}, {}, "loop.objective.kind"),
        ("tinker", "reverse_kl", {}, "loop.objective.kind"),
        ("tinker", {"kind": "forward_kl", "top_k": 20}, {}, "loop.objective.kind"),
        ("tinker", {"kind": "jsd", "top_k": 20, "tail": False}, {}, "loop.objective.kind"),
    ],
)
def test_an_objective_a_backend_cannot_train_is_refused_naming_both(
    backend, objective, extra, field
):
    data = named({"backend": backend, "loop": {"objective": objective}, **extra})
    with pytest.raises(SpecError, match=rf"^{field}: backend {backend} .*") as raised:
        parse_spec(data)
    kind = objective if isinstance(objective, str) else objective["kind"]
    assert kind in str(raised.value)


def test_the_default_objective_and_every_local_objective_are_accepted():
    for backend in ("local", "trio", "tinker"):
        assert parse_spec(named({"backend": backend})).loop.objective.kind == "sampled_reverse_kl"
    for objective in ("reverse_kl", "forward_kl", "jsd", {"kind": "reverse_kl", "top_k": 64}):
        parse_spec(named({"backend": "local", "loop": {"objective": objective}}))
    tinker = {"kind": "forward_kl", "top_k": 20, "tail": False}
    assert (
        parse_spec(named({"backend": "tinker", "loop": {"objective": tinker}})).loop.objective.top_k
        == 20
    )


def preset_spec(**fields: object) -> dict[str, object]:
    return {
        "backend": "local",
        "student": {"base_model": "arith-student"},
        "teacher": {"base_model": "arith-teacher"},
        "dataset": {"source": "file", "file": "file-1"},
        **fields,
    }


def test_a_file_for_an_arithmetic_student_gets_the_suffix_its_models_read() -> None:
    spec = JobSpec.model_validate(
        preset_spec(eval={"dataset": {"source": "inline", "prompts": ["q"]}})
    )
    assert spec.dataset.question_suffix == "Answer in \\boxed{}."
    assert spec.eval is not None and spec.eval.dataset is not None
    assert spec.eval.dataset.question_suffix == "Answer in \\boxed{}."


def test_a_written_suffix_and_other_students_keep_theirs() -> None:
    written = preset_spec(dataset={"source": "file", "file": "file-1", "question_suffix": ""})
    assert JobSpec.model_validate(written).dataset.question_suffix == ""
    other = preset_spec(student={"base_model": "Qwen/Qwen3-0.6B"})
    assert JobSpec.model_validate(other).dataset.question_suffix == DEFAULT_QUESTION_SUFFIX


def test_a_preset_student_learns_at_its_own_rate_unless_one_is_given() -> None:
    assert JobSpec.model_validate(preset_spec()).optim.learning_rate == 3e-3
    tiny = preset_spec(
        student={"base_model": "tiny-student"}, teacher={"base_model": "tiny-teacher"}
    )
    assert JobSpec.model_validate(tiny).optim.learning_rate == 1e-3
    given = preset_spec(optim={"learning_rate": 4e-5})
    assert JobSpec.model_validate(given).optim.learning_rate == 4e-5
    remote = preset_spec(student={"base_model": "Qwen/Qwen3-0.6B"})
    assert JobSpec.model_validate(remote).optim.learning_rate == 4e-5  # the reference's


def test_a_stored_spec_keeps_the_defaults_it_was_given() -> None:
    spec = JobSpec.model_validate(preset_spec())
    again = JobSpec.model_validate(spec.model_dump(mode="json"))
    assert again == spec
    moved = again.model_copy(
        update={"student": again.student.model_copy(update={"base_model": "tiny-student"})}
    )
    stored = JobSpec.model_validate(moved.model_dump(mode="json"))
    assert (
        stored.optim.learning_rate == 3e-3
        and stored.dataset.question_suffix == "Answer in \\boxed{}."
    )


def test_a_sampler_correction_is_a_name_or_a_kind_and_its_bound():
    loop = parse_spec(named({"backend": "local", "loop": {"sampler_correction": "mask"}})).loop
    assert (loop.sampler_correction.kind, loop.sampler_correction.c) == ("mask", 2.0)
    given = {"sampler_correction": {"kind": "truncate", "c": 5}}
    assert parse_spec(named({"backend": "local", "loop": given})).loop.sampler_correction.c == 5
    assert parse_spec(named({})).loop.sampler_correction.kind == "none"
    with pytest.raises(SpecError, match=r"^loop.sampler_correction.c: "):
        parse_spec(named({"backend": "local", "loop": {"sampler_correction": {"c": 1}}}))


@pytest.mark.parametrize(
    ("data", "field", "why"),
    [
        (
            {"backend": "trio", "loop": {"sampler_correction": "mask"}},
            "loop.sampler_correction.kind",
            "backend trio computes the loss on its own servers",
        ),
        (
            {"backend": "tinker", "loop": {"sampler_correction": "truncate"}},
            "loop.sampler_correction.kind",
            "backend tinker",
        ),
        (
            {"backend": "local", "loop": {"sampler_correction": "mask", "objective": "jsd"}},
            "loop.sampler_correction.kind",
            "no sampler's logprob enters it",
        ),
        (
            {"backend": "local", "sampling": {"top_p": 0.9}},
            "sampling.top_p",
            "subtracts the sampler's logprob",
        ),
        ({"backend": "trio", "sampling": {"top_k": 20}}, "sampling.top_k", "cut away"),
    ],
)
def test_what_would_bias_the_sampled_objective_is_refused_saying_why(data, field, why):
    with pytest.raises(SpecError, match=rf"^{field}: .*{why}"):
        parse_spec(named(data))


def test_truncated_sampling_is_accepted_with_a_logit_level_objective():
    data = {
        "backend": "local",
        "sampling": {"top_p": 0.9, "top_k": 20},
        "loop": {"objective": "jsd"},
    }
    assert parse_spec(named(data)).sampling.top_p == 0.9
