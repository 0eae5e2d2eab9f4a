"""What a spec may name as a model: a preset, a hub id or (local backend) a folder; any other
name is refused with the nearest preset named, before a worker tries the hub for it."""

from __future__ import annotations

import pytest

from kernel.model_names import PRESETS, model_name_refusal, preset_tokenizer
from kernel.spec import parse_spec
from kernel.spec.checks import model_name_refusals
from tests.support import named


@pytest.mark.parametrize(
    "name", [*PRESETS, "Qwen/Qwen3.5-4B", "org/model.v2", "/data/models/qwen", "./models/x"]
)
def test_the_local_backend_takes_presets_hub_ids_and_folders(name):
    assert model_name_refusal("local", name) is None


def test_smollm2_is_a_local_preset_over_a_tokenizer_of_its_own():
    assert model_name_refusal("local", "smollm2-135m-instruct") is None
    assert preset_tokenizer("smollm2-135m-instruct") == "smollm2"
    assert "smollm2-135m-instruct" in model_name_refusal("local", "gpt2")  # the presets list
    assert model_name_refusal("local", "/data/models/smollm2.Q4_1.gguf") is None
    assert preset_tokenizer("/data/models/smollm2.Q4_1.gguf") is None  # the worker reads it


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("tiny-teachr", "did you mean tiny-teacher?"),
        ("arith-studnt", "did you mean arith-student?"),
        ("gpt2", "the presets are tiny-student, tiny-teacher, arith-teacher"),
        ("org/has space", "no built-in preset, hub id (org/name) or model folder"),
    ],
)
def test_the_local_backend_refuses_any_other_name_with_the_nearest_preset(name, says):
    assert says in model_name_refusal("local", name)


@pytest.mark.parametrize("backend", ["trio", "tinker"])
def test_a_remote_backend_takes_hub_ids_and_says_a_preset_is_local(backend):
    for name in ("Qwen/Qwen3.5-4B", "meta-llama/Llama-3.1-8B", "student/model"):
        assert model_name_refusal(backend, name) is None
    refusal = model_name_refusal(backend, "tiny-teacher")
    assert "hub id (org/name" in refusal and "tiny-teacher is a preset of backend: local" in refusal
    assert "preset" not in model_name_refusal(backend, "/data/models/qwen")


def test_every_model_name_of_a_spec_is_checked_at_its_field():
    spec = parse_spec(
        named(
            {
                "backend": "local",
                "student": {"base_model": "tiny-studnet"},
                "teachers": {"add": {"base_model": "tiny-teacher"}, "mul": {"base_model": "x"}},
                "teacher_mixture": "mixture",
            }
        )
    )
    assert [field for field, _ in model_name_refusals(spec)] == [
        "student.base_model",
        "teachers.mul.base_model",
    ]
