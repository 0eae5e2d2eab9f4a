"""The forms' YAML: read with the limits the API's JSON has (`read_yaml`); the new-job form's
checked by the API's own rules (`parse_spec`, the data-root rule for dataset files, the
model names), with each problem placed at the line of its field."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from kernel.datapaths import DataPathError, confine_data_path
from kernel.model_names import model_name_refusals
from kernel.spec import JobSpec, SpecError, parse_spec, unlisted_tracker

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


class YamlRefused(ValueError):
    """A form's YAML that is not read: too long, with aliases, or not YAML; `line` (1-based)
    where, if known."""

    def __init__(self, message: str, line: int | None) -> None:
        super().__init__(message)
        self.line = line


def read_yaml(text: str, what: str = "a spec") -> Any:
    """The document a form's YAML holds, read with the limits the API's JSON has: at most
    MAX_SPEC_CHARS characters, and no anchors or aliases, which let a short text stand for
    a huge tree (a "billion laughs"); specs and sweeps never need one."""
    if len(text) > MAX_SPEC_CHARS:
        raise YamlRefused(f"{what} has at most {MAX_SPEC_CHARS:,} characters", 1)
    try:
        if any(isinstance(event, yaml.AliasEvent) for event in yaml.parse(text)):
            raise YamlRefused("YAML anchors and aliases (&name, *name) are not accepted", None)
        return yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        problem = getattr(error, "problem", None) or str(error)
        line = None if mark is None else mark.line + 1
        raise YamlRefused(f"not valid YAML: {problem}", line) from None


def check_spec_text(text: str, data_root: Path, trackers: Sequence[str] = ()) -> SpecCheck:
    """Parse and validate a YAML (or JSON) spec; `spec` is None when there are errors.
    `trackers`: the MLflow servers the service may mirror to."""
    try:
        data = read_yaml(text)
    except YamlRefused as refused:
        return failed("spec", refused.line, str(refused))
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
    for field, path in spec.dataset_files():
        try:
            confine_data_path(path, data_root)
        except DataPathError as error:
            return failed(field, line_of(yaml.compose(text), field), str(error))
    if refusal := unlisted_tracker(spec, trackers):
        path = "trackers.mlflow.tracking_uri"
        return failed(path, line_of(yaml.compose(text), path), refusal)
    if refusals := model_name_refusals(spec):
        root = yaml.compose(text)
        return SpecCheck(None, [FieldError(f, line_of(root, f), why) for f, why in refusals])
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
