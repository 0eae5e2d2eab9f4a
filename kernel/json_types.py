"""JSON's types as the API's documents state them, for every model a request body, a job
spec or a sweep is read into (`JsonModel`), and YAML read with JSON's numbers (`load_yaml`).

Pydantic's lax mode converts between JSON's types: it reads `true` as 1, `"90"` as 90,
`"0.5"` as 0.5, and 1 or `"yes"` as true, which the JSON Schemas refuse (a client
generated from them never sends such a body, and a typo'd one should hear why). Its strict
mode refuses too much: 12.0, which JSON Schema's integer is (a number without a fraction),
and, since FastAPI validates a parsed body as Python, an enum's value, a path or a date
written as text. So a `JsonModel` lets each field validate as before and then refuses a
number or boolean that came as another JSON type, with pydantic's own error ("should be a
whole number, not true" in kernel/wording.py's words).
"""

from __future__ import annotations

import numbers
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Self

import yaml
from pydantic import (
    BaseModel,
    ModelWrapValidatorHandler,
    ValidationError,
    ValidationInfo,
    model_validator,
)
from pydantic_core import InitErrorDetails

from kernel.wording import located, unwrapped

FORM_TEXT = {"form_text": True}
"""The validation context of an HTML form's fields, which are all text: their numbers are
read from the digits typed (`"3"` is 3)."""

Location = tuple[str | int, ...]


def json_type(value: Any) -> str | None:
    """The JSON type a value is (None for what JSON has no type for: a model, a date)."""
    if value is None or isinstance(value, bool):
        return "null" if value is None else "boolean"
    if isinstance(value, numbers.Real):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, Mapping):
        return "object"
    if isinstance(value, Sequence):
        return "array"
    return None


def type_error(kind: Any, given: Any) -> str | None:
    """Pydantic's error type where a field of type `kind` (a number or a boolean) was
    given a value that lax mode converts from another JSON type: `true` or `"1"` for a
    number, 1 or `"true"` for a boolean; None otherwise."""
    given_type = json_type(given)
    if kind is bool and given_type in ("number", "string"):
        return "bool_type"
    if kind in (int, float) and given_type in ("boolean", "string"):
        return "int_type" if kind is int else "float_type"
    return None


def converted(given: Any, result: Any, at: Location = ()) -> Iterator[InitErrorDetails]:
    """An error where validation turned `given` into a number or a boolean of another
    JSON type (`result` is what it made of `given`)."""
    if json_type(result) in ("number", "boolean"):
        error_type = type_error(type(result) if isinstance(result, bool | int) else float, given)
        if error_type is not None:
            yield InitErrorDetails(type=error_type, loc=at, input=given)
    elif json_type(result) == json_type(given) == "array" and len(given) == len(result):
        for index, (item, out) in enumerate(zip(given, result, strict=True)):
            yield from converted(item, out, (*at, index))
    elif json_type(result) == json_type(given) == "object":
        for key in result:
            if key in given:
                yield from converted(given[key], result[key], (*at, key))


def mistyped(
    given: Iterable[tuple[Location, Any]], model: type[BaseModel]
) -> list[InitErrorDetails]:
    """Type errors for the values (each at its location in `model`) of another JSON type
    than their field's: `true` for a count, read as 1 and then refused by a bound, or
    accepted while another field was refused. A union's branches are left to their own
    errors (a value one branch takes is of no other type for the union)."""
    found: dict[Location, InitErrorDetails] = {}
    for loc, value in given:
        _, at, branch = located(loc, model)
        error_type = None if branch else type_error(unwrapped(at[-1])[0], value)
        if error_type is not None:
            found.setdefault(loc, InitErrorDetails(type=error_type, loc=loc, input=value))
    return list(found.values())


def keys_given(model: type[BaseModel], data: Mapping[str, Any]) -> dict[str, str]:
    """The key `data` gives each field of `model` by (its alias or its name), by field."""
    keys = {}
    for name, field in model.model_fields.items():
        key = field.alias if field.alias in data else name
        if key in data:
            keys[name] = key
    return keys


class JsonModel(BaseModel):
    """Base of every model the API reads a body into: a field that JSON Schema calls an
    integer, a number or a boolean takes only that JSON type (12.0 is an integer, 1 a
    number); other conversions (an enum's value, a date's text) are lax mode's. A nested
    model checks its own fields (it is a JsonModel too). A value of the wrong type is
    reported before the other problems of its model (which its conversion may have made)."""

    @model_validator(mode="wrap")
    @classmethod
    def _json_types_kept(
        cls, data: Any, handler: ModelWrapValidatorHandler[Self], info: ValidationInfo
    ) -> Self:
        if not isinstance(data, Mapping) or (info.context or {}).get("form_text"):
            return handler(data)
        try:
            model = handler(data)
        except ValidationError as error:
            fields = [((key,), data[key]) for key in keys_given(cls, data).values()]
            errors = [(tuple(e["loc"]), e["input"]) for e in error.errors()]
            found = mistyped([*fields, *errors], cls)
            if not found:
                raise
            raise ValidationError.from_exception_data(cls.__name__, found) from None
        found = [
            problem
            for name, key in keys_given(cls, data).items()
            for problem in converted(data[key], getattr(model, name), (key,))
        ]
        if found:
            raise ValidationError.from_exception_data(cls.__name__, found)
        return model


class JsonNumbersLoader(yaml.SafeLoader):
    """PyYAML's safe loader, reading `1e-3` as a number, as YAML 1.2 and JSON do (YAML 1.1
    wants `1.0e-3`, and reads `1e-3` as text, which a number field refuses)."""


JsonNumbersLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


def load_yaml(text: str) -> Any:
    """The document YAML text holds, its numbers read as JSON reads them."""
    return yaml.load(text, Loader=JsonNumbersLoader)
