"""The forms' YAML: read with the limits the API's JSON has (`read_yaml`); the new-job form's
parsed and validated as the API's JSON is (`parse_spec`), with each problem placed at the
line of its field (admission's refusals too, by `line_of`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml

from kernel.json_types import load_yaml
from kernel.spec import JobSpec, SpecError, parse_spec
from kernel.spec.documents import line_of, not_a_mapping

MAX_SPEC_CHARS = 200_000
MAX_DEPTH = 64


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


class YamlRefused(ValueError):
    """A form's YAML that is not read: too long, with aliases, or not YAML; `line` (1-based)
    where, if known."""

    def __init__(self, message: str, line: int | None) -> None:
        super().__init__(message)
        self.line = line


def read_yaml(text: str, what: str = "a spec") -> Any:
    """The document a form's YAML holds, read with the limits the API's JSON has: at most
    MAX_SPEC_CHARS characters, and no anchors or aliases, which let a short text stand for
    a huge tree (a "billion laughs"), and at most MAX_DEPTH levels of nesting (the loader
    recurses per level); specs and sweeps never need either."""
    if len(text) > MAX_SPEC_CHARS:
        raise YamlRefused(f"{what} has at most {MAX_SPEC_CHARS:,} characters", 1)
    try:
        depth = 0
        for event in yaml.parse(text):
            if isinstance(event, yaml.AliasEvent):
                raise YamlRefused("YAML anchors and aliases (&name, *name) are not accepted", None)
            if isinstance(event, yaml.CollectionStartEvent):
                depth += 1
                if depth > MAX_DEPTH:
                    line = event.start_mark.line + 1
                    raise YamlRefused(f"{what} nests at most {MAX_DEPTH} levels deep", line)
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
        return load_yaml(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        problem = getattr(error, "problem", None) or str(error)
        line = None if mark is None else mark.line + 1
        raise YamlRefused(f"not valid YAML: {problem}", line) from None


def check_spec_text(text: str) -> SpecCheck:
    """Parse and validate a YAML (or JSON) spec; `spec` is None when there are errors."""
    try:
        data = read_yaml(text)
    except YamlRefused as refused:
        return failed("spec", refused.line, str(refused))
    if not isinstance(data, dict):
        return failed("spec", 1, not_a_mapping(data, "a spec"))
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
