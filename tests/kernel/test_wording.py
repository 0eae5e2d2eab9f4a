"""Pydantic's errors in the user's words (kernel/wording.py): fields named as written, no
Python type names, one problem for the branches of a union, the field an unknown key meant."""

from __future__ import annotations

from typing import Annotated, Any

import pytest
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kernel.spec import JobSpec
from kernel.wording import one_line, problems
from tests.support import named


class Part(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: str


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid")
    content: str | list[Part]
    tags: dict[Annotated[str, Field(max_length=3)], int] = {}


def worded(model: type[BaseModel], data: Any) -> list[tuple[str, str]]:
    with pytest.raises(ValidationError) as refused:
        model.model_validate(data)
    return problems(refused.value.errors(), model)


def test_the_branches_of_a_union_are_one_problem_without_their_type_names():
    """Before: `content.str: Input should be a valid string; content.list[Part]: Input
    should be a valid list`."""
    assert worded(Message, {"content": 5}) == [("content", "should be a string or a list, not 5")]


def test_a_branch_that_got_further_keeps_its_field():
    assert worded(Message, {"content": [{"txt": "a"}]}) == [
        ("content", "should be a string, not a list"),
        ("content.0.text", "this field is required"),
        ("content.0.txt", "unknown field; did you mean `content.0.text`?"),
    ]


def test_a_mapping_key_is_named_by_its_field_not_by_pydantics_marker():
    """Before: `tags.long.[key]: String should have at most 3 characters`."""
    assert worded(Message, {"content": "a", "tags": {"long": 1}}) == [
        ("tags.long", "this key should have at most 3 characters")
    ]


@pytest.mark.parametrize(
    ("data", "line"),
    [
        (None, "should be a mapping of fields, not empty (null)"),
        ([1], "should be a mapping of fields, not a list"),
        (
            named({"loop": {"steps": True, "batch_size": "2x"}}),
            "loop.steps: should be a whole number, not true; "
            'loop.batch_size: should be a whole number, not "2x"',
        ),
        (
            named({"loop": {"loss_fn": "ce"}}),
            "loop.loss_fn: should be 'importance_sampling', 'ppo', 'cispo' or 'dro', not \"ce\"",
        ),
        (
            named({"swanlab": {"enabled": "maybe"}}),
            'swanlab.enabled: should be true or false, not "maybe"',
        ),
        (
            named({"name": "my job"}),
            "name: should be letters, digits, '.', '_' and '-', starting with a letter or a "
            'digit, not "my job"',
        ),
    ],
)
def test_no_python_name_reaches_the_user(data, line):
    """Before: `Input should be a valid dictionary or instance of JobSpec`, `Input should be
    a valid integer, unable to parse string as an integer`, `Input should be a valid
    boolean, unable to interpret input`."""
    message = one_line(worded(JobSpec, data))
    assert message == line
    for python in ("NoneType", "instance of", "Value error", "Extra inputs", "Input should"):
        assert python not in message
