"""The spec of a self teacher (`teacher.self`) and of the eval's format grader: what they
accept, what the stored spec records, and each refusal naming its field."""

from __future__ import annotations

from typing import Any

import pytest

from kernel.spec import SpecError, parse_spec
from kernel.spec.teachers import priced_teacher

CONTEXT = {
    "system": "Answer with the number only, no words.",
    "examples": [{"user": "What is 3 + 4?", "assistant": "7"}],
}


def spec(teacher: dict[str, Any] | None = None, **groups: Any) -> dict[str, Any]:
    return {
        "backend": "local",
        "student": {"base_model": "tiny-student"},
        "teacher": teacher if teacher is not None else {"self": CONTEXT},
        "dataset": {"source": "arithmetic"},
        **groups,
    }


def problems(data: dict[str, Any]) -> list[tuple[str, str]]:
    with pytest.raises(SpecError) as refused:
        parse_spec(data)
    return refused.value.problems


def test_a_self_teacher_is_the_students_model_and_is_priced_at_it():
    parsed = parse_spec(spec())

    assert parsed.teacher.base_model == "tiny-student"
    assert parsed.teacher.self is not None
    assert (parsed.teacher.self.weights, parsed.teacher.self.reference) == ("base", False)
    assert parsed.teacher.self.examples[0].assistant == "7"
    stored = parsed.model_dump(mode="json")
    assert parse_spec(stored) == parsed, "the stored spec reads back the same"
    teachers = parsed.model_dump(include={"teachers"})["teachers"]
    assert priced_teacher(stored["teacher"]["base_model"], teachers) == "tiny-student"


def test_self_teachers_among_several_take_the_students_model_too():
    parsed = parse_spec(
        spec(
            teacher=None,
            teachers={"prompted": {"self": CONTEXT}, "other": {"base_model": "tiny-teacher"}},
            teacher_mixture="mixture",
            loop={"batch_size": 2},
        )
        | {"teacher": None}
    )
    assert parsed.teachers is not None
    assert parsed.teachers["prompted"].base_model == "tiny-student"


def test_a_reference_reading_teacher_takes_datasets_with_answers():
    parse_spec(spec({"self": {"reference": True}}))
    parse_spec(
        spec(
            {"self": {"reference": True}},
            dataset={"source": "inline", "prompts": ["What is 1 + 1?"], "answers": ["2"]},
        )
    )


@pytest.mark.parametrize(
    ("data", "field", "says"),
    [
        (spec({"self": {"weights": "current"}}), "teacher.self.weights", "is the student itself"),
        (spec({"self": {"weights": "latest"}}), "teacher.self.weights", "'base' or 'current'"),
        (
            spec({"self": CONTEXT, "base_model": "tiny-teacher"}),
            "teacher.base_model",
            "a self teacher is the student's own model: leave base_model out",
        ),
        (
            spec({"self": CONTEXT, "model_path": "/data/lora"}),
            "teacher.self",
            "give teacher.model_path or teacher.self, not both",
        ),
        (
            spec({"self": {"reference": True}}, dataset={"source": "inline", "prompts": ["q"]}),
            "teacher.self.reference",
            "dataset (inline) has none: give its answers",
        ),
        (
            spec(
                {"self": {"reference": True}},
                dataset={"source": "file", "path": "questions.jsonl"},
            ),
            "teacher.self.reference",
            "name its answer column in answer_field",
        ),
        (
            spec(
                {"self": {"reference": True}},
                eval={"dataset": {"source": "inline", "prompts": ["q"]}},
            ),
            "teacher.self.reference",
            "eval.dataset (inline) has none",
        ),
        (
            spec({"self": {"examples": [{"user": "", "assistant": "7"}]}}),
            "teacher.self.examples.0.user",
            "at least 1 character",
        ),
        (
            spec({"self": {"examples": [{"user": "q", "assistant": "a"}] * 33}}),
            "teacher.self.examples",
            "at most 32 items",
        ),
        (
            spec(eval={"holdout": 4, "grader": {"regex": "(unclosed"}}),
            "eval.grader.regex",
            "is not a regular expression",
        ),
        (spec(eval={"holdout": 4, "grader": "regex"}), "eval.grader", "should be a mapping"),
    ],
    ids=lambda value: value if isinstance(value, str) else "",
)
def test_each_refusal_names_its_field(data, field, says):
    found = problems(data)
    assert any(where == field and says in message for where, message in found), found


def test_the_eval_grader_is_boxed_unless_a_format_is_given():
    assert parse_spec(spec(eval={"holdout": 4})).eval.grader.boxed
    assert parse_spec(spec(eval={"holdout": 4, "grader": "boxed"})).eval.grader.boxed
    graded = parse_spec(spec(eval={"holdout": 4, "grader": {"regex": "-?[0-9]+"}}))
    assert graded.eval is not None and graded.eval.grader.regex == "-?[0-9]+"
