"""The spec of several teachers and datasets: what it accepts, and each refusal naming its
field."""

from __future__ import annotations

from typing import Any

import pytest

from kernel.spec import SpecError, parse_spec
from tests.support import named


def inline(name: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "source": "inline", "prompts": [f"{name}?"], **extra}


TWO_TEACHERS = {"add": {"base_model": "t-add"}, "mul": {"base_model": "t-mul", "weight": 2}}
ROUTED = [inline("add", teacher="add"), inline("mul", teacher="mul")]


def spec(**groups: Any) -> dict[str, Any]:
    return named({"backend": "local", "loop": {"batch_size": 4}, **groups})


def problems(data: dict[str, Any]) -> list[tuple[str, str]]:
    with pytest.raises(SpecError) as refused:
        parse_spec(data)
    return refused.value.problems


def test_a_one_teacher_one_dataset_spec_is_the_one_pool_case():
    parsed = parse_spec(spec(dataset={"source": "inline", "prompts": ["q"]}))
    [share] = parsed.dataset_shares()
    assert (share.name, share.weight, parsed.route_of(share)) == ("dataset", 1.0, "teacher")
    assert list(parsed.teacher_specs()) == ["teacher"]
    assert not parsed.several_datasets()


def test_routed_teachers_and_weighted_datasets_survive_a_round_trip():
    parsed = parse_spec(spec(teachers=TWO_TEACHERS, datasets=ROUTED))
    assert [parsed.route_of(share) for share in parsed.dataset_shares()] == ["add", "mul"]
    assert parse_spec(parsed.model_dump(mode="json")) == parsed
    mixed = parse_spec(
        spec(teachers=TWO_TEACHERS, datasets=[inline("a"), inline("b")], teacher_mixture="mixture")
    )
    assert mixed.teacher_weights() == {"add": 1.0, "mul": 2.0}
    assert [mixed.route_of(share) for share in mixed.dataset_shares()] == [None, None]


@pytest.mark.parametrize(
    ("groups", "field", "says"),
    [
        (
            {
                "teachers": TWO_TEACHERS,
                "datasets": [inline("add", teacher="add"), inline("add", teacher="mul")],
            },
            "datasets.1.name",
            "names two datasets",
        ),
        (
            {
                "teachers": TWO_TEACHERS,
                "datasets": [inline("add", teacher="add"), inline("mul", teacher="div")],
            },
            "datasets.1.teacher",
            "names no teacher",
        ),
        (
            {
                "teachers": TWO_TEACHERS,
                "datasets": [inline("add", teacher="add"), inline("mul", teacher="add")],
            },
            "teachers.mul",
            "no dataset routes to this teacher",
        ),
        (
            {"teachers": {"a": {"base_model": "t", "weight": 0}}},
            "teachers.a.weight",
            "greater than 0",
        ),
        ({"datasets": [inline("a", weight=-1)]}, "datasets.0.weight", "greater than 0"),
        (
            {"teacher": {"base_model": "t"}, "teachers": {"a": {"base_model": "t"}}},
            "teachers",
            "not both",
        ),
        (
            {"dataset": {"source": "inline", "prompts": ["q"]}, "datasets": [inline("a")]},
            "datasets",
            "not both",
        ),
        ({"teachers": TWO_TEACHERS}, "datasets", "needs datasets naming them"),
        (
            {
                "teachers": TWO_TEACHERS,
                "datasets": [inline("a", teacher="add"), inline("b")],
                "teacher_mixture": "mixture",
            },
            "datasets.0.teacher",
            "every teacher scores every dataset",
        ),
        (
            {"datasets": [inline(n) for n in "abcde"]},
            "loop.batch_size",
            "at least the number of datasets (5)",
        ),
        ({"loop": {"reward": {"coef": -1}}}, "loop.reward.coef", "greater than or equal to 0"),
    ],
)
def test_each_refusal_names_its_field(groups, field, says):
    [(path, message)] = problems(spec(**groups))
    assert path == field
    assert says in message
