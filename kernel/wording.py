"""Pydantic's validation errors in a person's words, for every door: the API's 422s and the
OpenAI-compatible routes' 400s, the dashboard's forms, `opd submit` and `opd run`.

Each problem is (field, message). The field is the dotted path as the user wrote it:
pydantic's own labels (a union member's tag or type name, `[key]`) are walked out of it
against the model. The message says what is wrong without Python's names for things
(`Value error, `, `Extra inputs are not permitted`, `NoneType`, `instance of JobSpec`), says
what was given, and an unknown key comes with the field it most likely meant.
"""

from __future__ import annotations

import difflib
import json
import re
import types
from collections.abc import Iterable, Mapping, Sequence
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel

Problem = tuple[str, str]
"""(dotted field path, message); the path is "" for the whole document."""

CLOSE_ENOUGH = 0.7
"""difflib's ratio above which an unknown key is taken for a misspelt field."""
MAX_SUGGESTIONS = 3
MAX_SHOWN_CHARS = 40

EXPECTED = {
    "string_type": "a string",
    "int_type": "a whole number",
    "int_parsing": "a whole number",
    "int_from_float": "a whole number",
    "float_type": "a number",
    "float_parsing": "a number",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "list_type": "a list",
    "tuple_type": "a list",
    "set_type": "a list",
    "dict_type": "a mapping",
    "model_type": "a mapping of fields",
    "model_attributes_type": "a mapping of fields",
    "dataclass_type": "a mapping of fields",
}
"""What a type error's field takes, by pydantic's error type."""
PATTERNS = {
    r"^[A-Za-z0-9][A-Za-z0-9._-]*$": "letters, digits, '.', '_' and '-', starting with a "
    "letter or a digit",
}
"""The patterns of the spec's names, in words (others are shown as the pattern)."""
SIZED = re.compile(
    r"^(?:List|String|Dictionary|Tuple|Set|Value|Data) should (.*?)(?: after validation)?(,.*)?$"
)


def shown(value: Any) -> str:
    """A value as the user wrote it in JSON or YAML, cut short: `null`, `true`, `"abc"`."""
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list"
    if isinstance(value, bytes):
        value = value.decode(errors="replace")
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = str(value)
    return text if len(text) <= MAX_SHOWN_CHARS else text[: MAX_SHOWN_CHARS - 3] + "..."


def either(quoted: str) -> str:
    """`'a', 'b', 'c'` (pydantic's list of tags) as `'a', 'b' or 'c'`."""
    parts = [part.strip() for part in quoted.split(",")]
    return parts[0] if len(parts) == 1 else f"{', '.join(parts[:-1])} or {parts[-1]}"


def unwrapped(annotation: Any, discriminator: str | None = None) -> tuple[Any, str | None]:
    """The type under `Annotated` and `Optional`, with the discriminator declared on it."""
    while True:
        if get_origin(annotation) is Annotated:
            annotation, *metadata = get_args(annotation)
            for meta in metadata:
                if isinstance(getattr(meta, "discriminator", None), str):
                    discriminator = meta.discriminator
            continue
        members = union_members(annotation)
        if len(members) == 1 and members[0] is not annotation:
            annotation = members[0]
            continue
        return annotation, discriminator


def union_members(annotation: Any) -> list[Any]:
    if get_origin(annotation) not in (Union, types.UnionType):
        return [annotation]
    return [member for member in get_args(annotation) if member is not type(None)]


def is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def fields_of(model: type[BaseModel]) -> dict[str, Any]:
    """A model's fields by the names a user writes (aliases too)."""
    fields = dict(model.model_fields)
    fields.update({f.alias: f for f in model.model_fields.values() if f.alias})
    return fields


def tag_of(member: Any, discriminator: str | None) -> str | None:
    """The tag pydantic writes into an error's location for a union member."""
    member, _ = unwrapped(member)
    if discriminator and is_model(member) and discriminator in member.model_fields:
        values = get_args(member.model_fields[discriminator].annotation)
        return str(values[0]) if values else None
    return getattr(get_origin(member) or member, "__name__", None)


def tags_of(annotation: Any, discriminator: str | None) -> list[str]:
    members = union_members(unwrapped(annotation, discriminator)[0])
    return [tag for tag in (tag_of(m, discriminator) for m in members) if tag]


def looks_like_label(part: str | int) -> bool:
    """Whether a part of a location beyond what the model declares is pydantic's name for
    a type (`function-after[...]`, `list[int]`) rather than a key."""
    return isinstance(part, str) and ("[" in part or "-" in part)


def below(
    annotation: Any, discriminator: str | None, part: str | int
) -> tuple[Any, str | None, bool]:
    """The type at `part` under `annotation`, its discriminator, and whether `part` is a
    label pydantic added (a union member's tag) rather than something the user wrote.
    An unknown type (None) when the location leaves what the model declares."""
    annotation, discriminator = unwrapped(annotation, discriminator)
    if annotation is None:
        return None, None, looks_like_label(part)
    members = union_members(annotation)
    if len(members) > 1:
        for member in members:
            tag = tag_of(member, discriminator)
            if tag is not None and (part == tag or str(part).startswith(f"{tag}[")):
                return member, None, True
        for member in members:  # a location that field_error wrote, with no tag in it
            inner = below(member, None, part)
            if inner[0] is not None:
                return inner
        return None, None, looks_like_label(part)
    if is_model(annotation):
        field = fields_of(annotation).get(str(part))
        if field is None:
            return None, None, False
        return field.annotation, field.discriminator, False
    origin, args = get_origin(annotation), get_args(annotation)
    if origin in (list, tuple, set, frozenset, Sequence) and isinstance(part, int):
        return (args[0] if args else None), None, False
    if origin in (dict, Mapping) and len(args) == 2:
        return args[1], None, False
    return None, None, False


def located(loc: Sequence[str | int], model: Any) -> tuple[list[str | int], list[Any], bool]:
    """`loc` without pydantic's labels; the type at each written part (the model's at 0);
    and whether a label was dropped (the error is one branch of a union's)."""
    parts: list[str | int] = []
    at: list[Any] = [model]
    annotation, discriminator, labelled = model, None, False
    for part in loc:
        if part == "[key]":
            continue
        annotation, discriminator, label = below(annotation, discriminator, part)
        if label:
            labelled = True
            at[-1] = annotation
            continue
        parts.append(part)
        at.append(annotation)
    return parts, at, labelled


def dotted(parts: Sequence[str | int]) -> str:
    return ".".join(str(part) for part in parts)


def suggestions(key: str, parent: Any, path: Sequence[str | int]) -> list[str]:
    """The fields an unknown `key` most likely meant: close spellings beside it, else the
    same name (or close) one group down (`steps` at the top: `loop.steps`)."""
    parent, _ = unwrapped(parent)
    if not is_model(parent):
        return []
    siblings = list(fields_of(parent))
    close = difflib.get_close_matches(key, siblings, MAX_SUGGESTIONS, CLOSE_ENOUGH)
    if close:
        return [dotted([*path, name]) for name in close]
    scored = []
    for name, field in parent.model_fields.items():
        group, _ = unwrapped(field.annotation)
        if is_model(group):
            for inner in difflib.get_close_matches(key, list(fields_of(group)), 1, CLOSE_ENOUGH):
                ratio = difflib.SequenceMatcher(None, key, inner).ratio()
                scored.append((ratio, dotted([*path, name, inner])))
    best = max((ratio for ratio, _ in scored), default=0.0)
    return [field for ratio, field in scored if ratio == best][:MAX_SUGGESTIONS]


def did_you_mean(fields: list[str]) -> str:
    if not fields:
        return ""
    return "; did you mean " + " or ".join(f"`{field}`" for field in fields) + "?"


def message_of(error: Mapping[str, Any], parts: list[str | int], at: list[Any]) -> str:
    """What is wrong, in words that name no Python type."""
    kind, ctx = error.get("type", ""), error.get("ctx") or {}
    given, msg = error.get("input"), str(error.get("msg", ""))
    if kind == "extra_forbidden":
        key = str(parts[-1]) if parts else ""
        return "unknown field" + did_you_mean(
            suggestions(key, at[-2] if len(at) > 1 else None, parts[:-1])
        )
    if kind == "missing":
        return "this field is required"
    if kind in ("value_error", "assertion_error") and "error" in ctx:
        return str(ctx["error"])
    if kind == "union_tag_invalid":
        return f"should be {either(str(ctx.get('expected_tags', '')))}, not {shown(ctx.get('tag'))}"
    if kind == "union_tag_not_found":
        tags = tags_of(at[-1], str(ctx.get("discriminator", "")).strip("'")) if at else []
        listed = f": {either(', '.join(repr(t) for t in tags))}" if tags else ""
        return f"this field is required{listed}"
    if kind in EXPECTED:
        if given is None and kind in ("model_type", "model_attributes_type", "dict_type"):
            return f"should be {EXPECTED[kind]}, not empty (null)"
        return f"should be {EXPECTED[kind]}, not {shown(given)}"
    if kind in ("literal_error", "enum"):
        expected = str(ctx.get("expected", "")).replace("True", "true").replace("False", "false")
        return f"should be {expected}, not {shown(given)}"
    if kind == "string_pattern_mismatch" and str(ctx.get("pattern")) in PATTERNS:
        return f"should be {PATTERNS[str(ctx['pattern'])]}, not {shown(given)}"
    if sized := SIZED.match(msg):
        return f"should {sized.group(1)}{sized.group(2) or ''}"
    text = msg.removeprefix("Value error, ").removeprefix("Assertion failed, ")
    text = text.removeprefix("Input ")
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        text += f", not {given if isinstance(given, str) else shown(given)}"  # a form's number
    return text


def key_path(loc: Sequence[str | int]) -> bool:
    return bool(loc) and loc[-1] == "[key]"


def problems(errors: Iterable[Mapping[str, Any]], model: Any = None) -> list[Problem]:
    """Each of pydantic's errors (`ValidationError.errors()`, against `model`, the type
    validated: a model class, or None where unknown) as (field, message); the errors of
    one union's branches at one field are one problem ("should be a string or a list")."""
    worded: list[tuple[str, str, bool]] = []
    for error in errors:
        loc = list(error.get("loc", ()))
        parts, at, labelled = located(loc, model)
        message = message_of(error, parts, at)
        if key_path(loc):
            message = f"this key {message}"
        if error.get("type") in ("union_tag_invalid", "union_tag_not_found"):
            parts.append(str(error.get("ctx", {}).get("discriminator", "")).strip("'"))
        worded.append((dotted(parts), message, labelled))
    return merged(worded)


ALTERNATIVE = re.compile(r"^should be (.+), not (.+)$")


def merged(worded: list[tuple[str, str, bool]]) -> list[Problem]:
    """The union branches' messages at one field folded into one."""
    result: list[Problem] = []
    for path, message, labelled in worded:
        if labelled and result and result[-1][0] == path:
            result[-1] = (path, alternatives(result[-1][1], message))
        else:
            result.append((path, message))
    return result


def alternatives(first: str, second: str) -> str:
    """`should be a string, not 5` and `should be a list, not 5`: `should be a string or a
    list, not 5`; other pairs are joined with `, or `."""
    one, two = ALTERNATIVE.match(first), ALTERNATIVE.match(second)
    if one and two and one.group(2) == two.group(2):
        return f"should be {one.group(1)} or {two.group(1)}, not {one.group(2)}"
    return f"{first}, or {second}"


def one_line(found: Iterable[Problem], prefix: str = "") -> str:
    """Every problem as `field: message`, joined with `; ` (`prefix.` before each field)."""
    lines = []
    for path, message in found:
        field = ".".join(part for part in (prefix, path) if part)
        lines.append(f"{field}: {message}" if field else message)
    return "; ".join(lines)
