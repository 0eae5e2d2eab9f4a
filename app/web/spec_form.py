"""The new-job form's YAML: parsed and validated as the API's JSON is (`parse_spec`), with
each problem placed at the line of its field (admission's refusals too, by `line_of`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml

from kernel.spec import JobSpec, SpecError, parse_spec

MAX_SPEC_CHARS = 200_000


@dataclass(frozen=True)
class FieldError:
    """One problem: the field's dotted path ("spec" for the whole document), the 1-based
    line of the YAML where the field is written (None if it is not written), the message."""

    field: str
    line: int | None
    message: str


@dataclass(frozen=True)
class SpecCheck:
    spec: JobSpec | None
    errors: list[FieldError]
    data: Any = None
    """The document as written (parsed), when it is a spec."""


def check_spec_text(text: str) -> SpecCheck:
    """Parse and validate a YAML (or JSON) spec; `spec` is None when there are errors."""
    if len(text) > MAX_SPEC_CHARS:
        return failed("spec", 1, f"a spec has at most {MAX_SPEC_CHARS:,} characters")
    try:
        if any(isinstance(event, yaml.AliasEvent) for event in yaml.parse(text)):
            # An alias may stand for a huge tree (a "billion laughs"); specs never need one.
            return failed("spec", None, "YAML anchors and aliases (&name, *name) are not accepted")
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        problem = getattr(error, "problem", None) or str(error)
        return failed("spec", None if mark is None else mark.line + 1, f"not valid YAML: {problem}")
    if not isinstance(data, dict):
        return failed("spec", 1, f"a spec must be a mapping of groups, got {type(data).__name__}")
    try:
        spec = parse_spec(data)
    except SpecError as error:
        root = yaml.compose(text)
        return SpecCheck(
            None,
            [FieldError(path, line_of(root, path), message) for path, message in error.problems],
        )
    return SpecCheck(spec, [], data)


def failed(field: str, line: int | None, message: str) -> SpecCheck:
    return SpecCheck(None, [FieldError(field, line, message)])


def line_of(root: yaml.Node | None, path: str) -> int | None:
    """The line where the deepest written part of `path` is: its key in a mapping, its item
    in a list. Parts that are not written (a union's tag in pydantic's path, a missing
    field) are skipped, so a missing field points at its group."""
    node, line = root, None
    for part in path.split("."):
        child = child_node(node, part)
        if child is None:
            continue
        node, line = child[1], child[0]
    return line


def child_node(node: Any, part: str) -> tuple[int, yaml.Node] | None:
    """(line, value node) of a mapping's key or a sequence's item, if written."""
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode) and key.value == part:
                return key.start_mark.line + 1, value
    if isinstance(node, yaml.SequenceNode) and part.isdigit() and int(part) < len(node.value):
        item = node.value[int(part)]
        return item.start_mark.line + 1, item
    return None
