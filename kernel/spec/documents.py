"""A spec as people write it: a YAML or JSON file or parsed data, validated with every problem
named by its field (and, in a file, its line).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from kernel.json_types import load_yaml
from kernel.spec.job import JobSpec
from kernel.spec.teachers import STORED
from kernel.wording import one_line, problems, shown


class SpecError(ValueError):
    """A spec file that cannot be read or does not validate; the message names the field.
    `problems` holds each validation problem as (field path, message), for a caller that
    shows every one at its field."""

    def __init__(self, message: str, problems: list[tuple[str, str]] | None = None) -> None:
        super().__init__(message)
        self.problems = problems or []


def validation_problems(error: ValidationError, model: Any = None) -> list[tuple[str, str]]:
    """Each problem as (field path, message) in the user's words (kernel/wording.py), e.g.
    `("loop.stesp", "unknown field; did you mean `loop.steps`?")`; against `model`, the
    type validated (default: the job spec)."""
    return problems(error.errors(), JobSpec if model is None else model)


def format_validation_error(error: ValidationError, model: Any = None) -> str:
    """One line per problem, each naming the field path, e.g. `loop.steps: ...`."""
    return one_line(validation_problems(error, model))


def parse_spec(data: Any) -> JobSpec:
    """Validate already-parsed data, raising SpecError with field-named messages."""
    try:
        return JobSpec.model_validate(data)
    except ValidationError as error:
        raise SpecError(format_validation_error(error), validation_problems(error)) from error


def stored_spec(data: Any) -> JobSpec:
    """A spec the service stored, read back: fields since withdrawn from specs (a teacher
    server's `api_key_env`) are read as absent, so an old job still loads, lists, serves
    and fails or runs by today's rules; its stored JSON is left as it was."""
    return JobSpec.model_validate(data, context={STORED: True})


def flatten(spec: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """`{"loop": {"steps": 3}}` -> `{"loop.steps": 3}`; lists stay whole values."""
    flat: dict[str, Any] = {}
    for key, value in spec.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, f"{path}."))
        else:
            flat[path] = value
    return flat


MISSING = object()


def differing_fields(specs: Sequence[Mapping[str, Any]]) -> list[tuple[str, list[Any]]]:
    """The spec fields (dotted paths, in first-seen order) whose values are not all equal,
    each with every spec's value (None where a spec lacks the field): what a comparison of
    jobs shows, on the dashboard and in `opd compare`."""
    flats = [flatten(spec) for spec in specs]
    paths = list(dict.fromkeys(path for flat in flats for path in flat))
    rows = []
    for path in paths:
        values = [flat.get(path, MISSING) for flat in flats]
        if any(value != values[0] for value in values[1:]):
            rows.append((path, [None if value is MISSING else value for value in values]))
    return rows


def not_a_mapping(data: Any, what: str) -> str:
    """Why a document is no spec (or sweep): empty, or a list or a value, not a mapping."""
    if data is None:
        return f"{what} is empty: it must be a mapping of fields (`name: value` lines)"
    return f"{what} must be a mapping of fields (`name: value` lines), not {shown(data)}"


def read_document(path: str | Path, what: str = "spec") -> dict[str, Any]:
    """The mapping a YAML or JSON file holds (JSON is YAML, but its own parser says more);
    SpecError naming the file, and the line where it is not YAML or JSON."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise SpecError(f"cannot read {what} {path}: {error.strerror}") from error
    except UnicodeDecodeError:
        raise SpecError(f"{path} is not UTF-8 text") from None
    try:
        data = json.loads(text) if path.suffix == ".json" else load_yaml(text)
    except json.JSONDecodeError as error:
        raise SpecError(f"{path}, line {error.lineno}: not valid JSON: {error.msg}") from None
    except yaml.YAMLError as error:
        raise SpecError(f"{path}{yaml_problem(error)}") from None
    if not isinstance(data, dict):
        raise SpecError(f"{path}: {not_a_mapping(data, f'a {what}')}")
    return data


def yaml_problem(error: yaml.YAMLError) -> str:
    """`, line 3: not valid YAML: ...` for what PyYAML found, without its `"<unicode
    string>"` (the text it read has no name) or its excerpt of the text."""
    mark = getattr(error, "problem_mark", None)
    problem = getattr(error, "problem", None) or "cannot be read"
    context, started = getattr(error, "context", None), getattr(error, "context_mark", None)
    where = "" if mark is None else f", line {mark.line + 1}"
    opened = f" ({context} that starts on line {started.line + 1})" if context and started else ""
    return f"{where}: not valid YAML: {problem}{opened}"


def line_of(root: yaml.Node | None, path: str) -> int | None:
    """The line where the deepest written part of `path` is: its key in a mapping, its item
    in a list. Parts that are not written (a missing field) are skipped, so a missing field
    points at its group."""
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


def load_spec(path: str | Path) -> JobSpec:
    """Read a YAML or JSON spec file; SpecError names the file, and each problem its field
    and the line it is written on (`tiny.yaml, line 12: loop.stesp: unknown field; ...`)."""
    data = read_document(path)
    try:
        return parse_spec(data)
    except SpecError as error:
        try:
            root = yaml.compose(Path(path).read_text(encoding="utf-8"))
        except yaml.YAMLError:  # JSON that PyYAML's YAML 1.1 does not read: no lines
            root = None
        lines = []
        for field, message in error.problems:
            line = line_of(root, field)
            lines.append(f"{path}{'' if line is None else f', line {line}'}: {field}: {message}")
        raise SpecError("; ".join(lines), error.problems) from None
