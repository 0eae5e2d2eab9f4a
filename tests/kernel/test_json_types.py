"""A JsonModel's numbers and booleans take only their JSON type (what the API's documents
say), worded for the user; a form's text is still read as numbers; YAML reads `1e-3` as
a number, as JSON does, so a spec file that writes one keeps working."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import Field, ValidationError

from kernel.json_types import FORM_TEXT, JsonModel, load_yaml
from kernel.playground import SampleRequest
from kernel.spec import JobSpec, load_spec, validation_problems


class Inner(JsonModel):
    count: int = Field(1, ge=1)
    flags: list[bool] = Field(default_factory=list)


class Outer(JsonModel):
    size: int = Field(4, ge=4)
    rate: float | None = None
    on: bool = False
    ids: str | list[int] = ""
    inner: Inner | None = None
    by_name: dict[str, float] = Field(default_factory=dict)


def problems_of(data: dict[str, Any]) -> list[tuple[str, str]]:
    with pytest.raises(ValidationError) as refused:
        Outer.model_validate(data)
    return validation_problems(refused.value, Outer)


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"size": True}, [("size", "should be a whole number, not true")]),
        ({"size": "8"}, [("size", 'should be a whole number, not "8"')]),
        ({"rate": True}, [("rate", "should be a number, not true")]),
        ({"rate": "0.5"}, [("rate", 'should be a number, not "0.5"')]),
        ({"on": 1}, [("on", "should be true or false, not 1")]),
        ({"on": "yes"}, [("on", 'should be true or false, not "yes"')]),
        ({"ids": [5, True]}, [("ids.1", "should be a whole number, not true")]),
        ({"inner": {"count": "2"}}, [("inner.count", 'should be a whole number, not "2"')]),
        ({"inner": {"flags": [True, 0]}}, [("inner.flags.1", "should be true or false, not 0")]),
        ({"by_name": {"a": "1"}}, [("by_name.a", 'should be a number, not "1"')]),
    ],
)
def test_a_value_of_another_json_type_is_refused_in_words(
    data: dict[str, Any], expected: list[tuple[str, str]]
) -> None:
    assert problems_of(data) == expected


def test_the_type_is_what_is_wrong_not_the_bound_its_conversion_breaks() -> None:
    """`true` is not 1 below a bound of 4, nor is it hidden by another field's problem."""
    assert problems_of({"size": True, "inner": {"count": 0}}) == [
        ("size", "should be a whole number, not true")
    ]
    assert problems_of({"inner": {"count": True, "flags": "x"}}) == [
        ("inner.count", "should be a whole number, not true")
    ]


def test_values_of_their_own_json_type_convert_as_before() -> None:
    """12.0 is an integer (JSON Schema's is a number without a fraction), 1 a number, and
    a string stays a string where the union takes one."""
    model = Outer.model_validate({"size": 12.0, "rate": 1, "ids": "12", "inner": {"count": 2}})
    assert (model.size, model.rate, model.ids, model.inner) == (12, 1.0, "12", Inner(count=2))
    assert isinstance(model.size, int) and isinstance(model.rate, float)
    with pytest.raises(ValidationError, match="int_from_float"):
        Outer.model_validate({"size": 12.5})


def test_a_form_s_fields_are_read_as_the_numbers_typed() -> None:
    request = SampleRequest.model_validate(
        {"prompt": "Hi", "n": "2", "max_tokens": "16", "temperature": "0.5"}, context=FORM_TEXT
    )
    assert (request.n, request.max_tokens, request.temperature) == (2, 16, 0.5)
    with pytest.raises(ValidationError):
        SampleRequest.model_validate({"prompt": "Hi", "n": "2"})


def test_yaml_reads_numbers_as_json_does() -> None:
    assert load_yaml("a: 1e-3\nb: -2E+3\nc: .5e1\nd: 10\ne: 3.0e-3\nf: '1e-3'\ng: true") == {
        "a": 0.001,
        "b": -2000.0,
        "c": 5.0,
        "d": 10,
        "e": 0.003,
        "f": "1e-3",
        "g": True,
    }


def test_a_spec_file_keeps_its_numbers_and_refuses_a_quoted_count(tmp_path: Path) -> None:
    """`opd run` and `opd submit` read a spec file so: `learning_rate: 1e-3` (text to YAML
    1.1) is the number JSON would read; a count written as text is refused as the API does."""
    spec = tmp_path / "spec.yaml"
    text = (
        "name: typed\nbackend: local\nstudent: {base_model: tiny-student}\n"
        "teacher: {base_model: tiny-teacher}\ndataset: {source: inline, prompts: [Hi]}\n"
        "optim: {learning_rate: 1e-3}\nloop: {steps: 4, batch_size: 1, group_size: 2}\n"
    )
    spec.write_text(text)
    loaded = load_spec(spec)
    assert isinstance(loaded, JobSpec)
    assert loaded.optim.learning_rate == pytest.approx(1e-3, rel=1e-12)
    spec.write_text(text.replace("steps: 4", 'steps: "4"'))
    with pytest.raises(ValueError) as refused:
        load_spec(spec)
    assert 'loop.steps: should be a whole number, not "4"' in str(refused.value)
