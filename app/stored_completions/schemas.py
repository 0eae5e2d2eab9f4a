"""The feedback given on a stored completion (the filter that picks completions, and the
team's `metadata`, are the job spec's: kernel/spec/data.py)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from app.core.pages import ObjectList
from kernel.json_types import JsonModel
from kernel.spec.data import Metadata, Rating

MAX_CORRECTION_CHARS = 100_000
MAX_AUTHOR_CHARS = 200
FEEDBACK_PREFIX = "fb-"

Store = Annotated[
    bool | None,
    Field(
        description="Keep the completion for the team (GET /v1/chat/completions lists "
        "it), within its quota (OPD_TEAM_MAX_STORED_COMPLETIONS)."
    ),
]
StoredMetadata = Annotated[
    Metadata | None, Field(description="Labels kept with a stored completion: up to 16 pairs.")
]
"""A door's `store` and `metadata`: the chat and text completions' and the playground's."""


class FeedbackCreate(JsonModel):
    """`POST /v1/chat/completions/{id}/feedback`: a rating, a correction, or both."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={  # at least one of the two, as the document states it
            "anyOf": [
                {"required": ["rating"], "properties": {"rating": {"type": "integer"}}},
                {"required": ["correction"], "properties": {"correction": {"type": "string"}}},
            ]
        },
    )

    rating: Rating | None = Field(None, description="-1 (bad), 0 (neutral) or 1 (good).")
    correction: str | None = Field(
        None,
        min_length=1,
        max_length=MAX_CORRECTION_CHARS,
        description="The answer it should have given, or a note on what was wrong: what a "
        "`teacher.self` with `context: feedback` reads.",
    )
    author: str | None = Field(
        None, min_length=1, max_length=MAX_AUTHOR_CHARS, description="Who gave it."
    )

    @model_validator(mode="after")
    def _says_something(self) -> FeedbackCreate:
        if self.rating is None and self.correction is None:
            raise ValueError("give a rating, a correction or both")
        return self


class FeedbackPublic(BaseModel):
    """One piece of feedback on a stored completion."""

    id: str = Field(description="`fb-N`.")
    object: Literal["chat.completion.feedback"] = "chat.completion.feedback"
    completion_id: str
    rating: Rating | None
    correction: str | None
    author: str | None
    created_at: int = Field(description="Unix time.")


def feedback_id(row_id: int) -> str:
    return f"{FEEDBACK_PREFIX}{row_id}"


class StoredCompletionRead(BaseModel):
    """A stored chat completion as the SDK reads it from OpenAI's list and retrieve doors
    (`app/api/openai/stored.py` writes it): the fields it names, the rest kept as sent."""

    model_config = ConfigDict(extra="allow")

    id: str
    created: int = Field(description="Unix time.")
    model: str = Field(description="The `model` the request named.")
    choices: list[dict[str, Any]]
    metadata: dict[str, str] = Field(default_factory=dict)
    feedback: list[FeedbackPublic] = Field(default_factory=list)

    def answer(self) -> str:
        """The first choice's text (a tool call's answer reads as empty)."""
        if not self.choices:
            return ""
        return (self.choices[0].get("message") or {}).get("content") or ""


class StoredCompletionsRead(ObjectList[StoredCompletionRead]):
    """A page of them: while `has_more`, the next page is after `last_id`."""


class StoredMessageRead(BaseModel):
    """A message of a stored completion's conversation, as the messages door sends it."""

    model_config = ConfigDict(extra="allow")

    id: str
    role: str
    content: str | None = None


class StoredMessagesRead(ObjectList[StoredMessageRead]):
    """A page of a stored completion's messages."""
