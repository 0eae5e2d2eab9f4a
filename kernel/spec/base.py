"""What every group of the spec is made of: the base model (strict JSON types, no unknown
keys, finite numbers), names, checkpoint references, and the error that names a field.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import ConfigDict, Field, PlainValidator, ValidationError, WithJsonSchema
from pydantic_core import InitErrorDetails, PydanticCustomError

from kernel.json_types import JsonModel
from kernel.wording import shown

MAX_STEPS = 100_000
MAX_RETRY_DELAY_SECONDS = 30.0
Name = Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]
ModelName = Annotated[str, Field(min_length=1, max_length=500)]


class SpecModel(JsonModel):
    """Base for every spec group: unknown keys are an error, not a silent no-op, a number
    must be finite (JSON has no NaN or Infinity, and a database's JSON refuses them), and
    each field takes the JSON type its schema says (`true` is no count)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


def checkpoint_ref(value: Any) -> str | int:
    """`final`, or a step number (0..MAX_STEPS)."""
    if value == "final":
        return "final"
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_STEPS:
        return value
    raise ValueError(
        f"should be 'final' or a step number from 0 to {MAX_STEPS}, not {shown(value)}"
    )


CheckpointRef = Annotated[
    str | int,
    PlainValidator(checkpoint_ref),
    WithJsonSchema(
        {"anyOf": [{"const": "final"}, {"type": "integer", "minimum": 0, "maximum": MAX_STEPS}]}
    ),
]
"""A job's saved weights: `final` (saved when it ended) or the step they were saved after."""


def field_error(loc: tuple[str | int, ...], message: str) -> ValidationError:
    """A validation error at `loc` (a 422 whose param names the field), for the checks
    that span several fields of the spec."""
    return ValidationError.from_exception_data(
        "JobSpec",
        [InitErrorDetails(type=PydanticCustomError("value_error", message), loc=loc, input=None)],
    )
