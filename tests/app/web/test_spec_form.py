"""The new-job form's parsing: the API's validation, each problem at the line of its field
(admission's rules are the route's: tests/app/web/test_pages.py)."""

from __future__ import annotations

from pathlib import Path

from app.web.spec_form import check_spec_text
from tests.app.web.conftest import NAMED_YAML

ROOT = Path(__file__).resolve().parents[3]
TINY = (ROOT / "examples" / "tiny.yaml").read_text()


def test_the_tiny_example_passes():
    check = check_spec_text(TINY)
    assert check.errors == [] and check.spec is not None and check.spec.name == "tiny-opd"


def test_each_error_names_its_field_and_line():
    text = TINY.replace("lora_rank: 16", "lora_rank: 3").replace("steps: 60", "steps: 0")
    check = check_spec_text(text)
    assert check.spec is None
    lines = text.splitlines()
    placed = {error.field: error for error in check.errors}
    assert set(placed) == {"student.lora_rank", "loop.steps"}
    assert lines[placed["student.lora_rank"].line - 1].strip() == "lora_rank: 3"
    assert lines[placed["loop.steps"].line - 1].strip() == "steps: 0"
    assert "greater than or equal to 4" in placed["student.lora_rank"].message


def test_a_missing_field_points_at_its_group_and_a_list_item_at_its_line():
    missing = check_spec_text("name: x\ndataset:\n  source: inline\n" + NAMED_YAML)
    assert [(e.field, e.line) for e in missing.errors] == [("dataset.prompts", 2)]
    text = "name: x\ndataset:\n  source: inline\n  prompts:\n    - ok\n    - ''\n" + NAMED_YAML
    empty = check_spec_text(text)
    assert [(e.field, e.line) for e in empty.errors] == [("dataset.prompts.1", 6)]


def test_bad_yaml_aliases_and_non_mappings_are_errors_not_crashes():
    assert check_spec_text("a: [1,\n").errors[0].field == "spec"
    assert check_spec_text("- a\n- b\n").errors[0].message.startswith("a spec must be a mapping")
    bomb = "a: &a [x, x]\nb: &b [*a, *a]\nc: [*b, *b]\n"
    assert "aliases" in check_spec_text(bomb).errors[0].message
    assert "at most" in check_spec_text("#" * 300_000).errors[0].message
    deep = check_spec_text("name: x\nmetadata: " + "[" * 5000 + "]" * 5000 + "\n")
    assert [(e.field, e.line) for e in deep.errors] == [("spec", 2)]
    assert "nests at most 64 levels" in deep.errors[0].message


def test_a_non_finite_number_is_an_error_at_its_line():
    text = TINY.replace("learning_rate: 1.0e-3", "learning_rate: .nan")
    [error] = check_spec_text(text).errors
    assert (error.field, error.message) == (
        "optim.learning_rate",
        "should be a finite number",
    )
    assert text.splitlines()[error.line - 1].strip() == "learning_rate: .nan"
