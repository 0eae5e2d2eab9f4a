"""Stored completions at OpenAI's doors: what a completion served with `store: true` keeps
(the request's conversation and settings, the answer as sent, each choice's token ids and
logprobs, the team's metadata), and how it reads back in OpenAI's shapes (a chat
completion with its `metadata`, and this service's `feedback` beside; its messages; a
deletion). A text completion (`/v1/completions`) is kept as a chat of one user turn, its
prompt as the model read it, so that the same doors read it."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from app.api.openai.completions import CompletionRequest, TextCompletion
from app.api.openai.wire import (
    AssistantMessage,
    ChatCompletion,
    ChatCompletionRequest,
    Choice,
    Strict,
)
from app.core.pages import ObjectList
from app.playground.schemas import PlaygroundAnswer
from app.stored_completions.schemas import FeedbackPublic, feedback_id
from app.stored_completions.store import Given
from app.stored_completions.tables import Feedback, StoredCompletion
from kernel.chats.conversation import ChatMessage

SETTINGS = ("max_tokens", "max_completion_tokens", "temperature", "top_p", "n", "stop", "seed")
"""The sampling settings a stored completion keeps of its request."""


class StoredChatCompletion(ChatCompletion):
    """A stored chat completion: as it was answered, with its metadata and the feedback
    given on it (this service's own field, oldest first)."""

    metadata: dict[str, str] = Field(default_factory=dict)
    feedback: list[FeedbackPublic] = Field(default_factory=list)


class StoredChatCompletions(ObjectList[StoredChatCompletion]):
    """A page of stored chat completions: while `has_more`, pass `last_id` as `after`."""


class StoredMessage(BaseModel):
    """A message of a stored completion's conversation (OpenAI's store message)."""

    id: str = Field(description="`<completion id>-<place in the conversation>`.")
    role: str
    content: str | None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    content_parts: None = None


class StoredMessages(ObjectList[StoredMessage]):
    """A page of a stored completion's messages."""


class StoredCompletionDeleted(BaseModel):
    id: str
    object: Literal["chat.completion.deleted"] = "chat.completion.deleted"
    deleted: bool = True


class MetadataUpdate(Strict):
    """`POST /v1/chat/completions/{id}`: the metadata that replaces the completion's."""

    metadata: dict[str, str] | None = Field(description="Up to 16 string pairs; null clears them.")


def choice_tokens(answers: list[PlaygroundAnswer]) -> list[dict[str, Any]]:
    """Each choice's token ids and logprobs, in the order the choices were answered."""
    return [
        {"token_ids": completion.token_ids, "logprobs": completion.logprobs}
        for answer in answers
        for completion in answer.outputs[0].completions
    ]


def chat_row(
    team_id: int,
    job_id: int,
    body: ChatCompletionRequest,
    completion: ChatCompletion,
    answers: list[PlaygroundAnswer],
) -> StoredCompletion:
    """What a chat completion served with `store: true` keeps."""
    request = body.model_dump(include={"messages", "tools", *SETTINGS}, exclude_none=True)
    return kept("chat", team_id, job_id, body, request, completion, answers)


def kept(
    kind: str,
    team_id: int,
    job_id: int,
    body: ChatCompletionRequest | CompletionRequest,
    request: dict[str, Any],
    completion: ChatCompletion,
    answers: list[PlaygroundAnswer],
) -> StoredCompletion:
    return StoredCompletion(
        public_id=completion.id,
        team_id=team_id,
        job_id=job_id,
        model=body.model,
        kind=kind,
        request=request,
        response=completion.model_dump(mode="json"),
        tokens=choice_tokens(answers),
        metadata_=dict(body.metadata or {}),
    )


def text_row(
    team_id: int,
    job_id: int,
    body: CompletionRequest,
    completion: TextCompletion,
    answers: list[PlaygroundAnswer],
) -> StoredCompletion:
    """What a text completion served with `store: true` keeps: a chat of one user turn per
    prompt (the prompt as the model read it), its choices as the assistant's answers."""
    prompt = "\n\n".join(answer.prompt for answer in answers)
    request = body.model_dump(include={"prompt", *SETTINGS}, exclude_none=True)
    chat = ChatCompletion(
        id=completion.id,
        created=completion.created,
        model=completion.model,
        choices=[
            Choice(
                index=choice.index,
                message=AssistantMessage(content=choice.text),
                logprobs=None,
                finish_reason=choice.finish_reason,
            )
            for choice in completion.choices
        ],
        usage=completion.usage,
    )
    turn = {"messages": [{"role": "user", "content": prompt}]}
    return kept("text", team_id, job_id, body, request | turn, chat, answers)


def public_feedback(row: StoredCompletion, feedback: Feedback) -> FeedbackPublic:
    assert feedback.id is not None
    return FeedbackPublic(
        id=feedback_id(feedback.id),
        completion_id=row.public_id,
        rating=feedback.rating,  # type: ignore[arg-type]
        correction=feedback.correction,
        author=feedback.author,
        created_at=int(feedback.created_at.timestamp()),
    )


def stored_view(row: StoredCompletion, given: Given) -> StoredChatCompletion:
    """The completion as the doors read it back."""
    return StoredChatCompletion.model_validate(
        row.response
        | {
            "metadata": row.metadata_,
            "feedback": [public_feedback(row, f) for f in given.of(row)],
        }
    )


def messages_of(row: StoredCompletion) -> list[StoredMessage]:
    """The conversation the completion answered, each message with its id (its content
    as text: its text parts joined, as the chat door joins them)."""
    messages = [ChatMessage.model_validate(message) for message in row.request["messages"]]
    return [
        StoredMessage(
            id=f"{row.public_id}-{place}",
            role=message.role,
            content=None if message.content is None else message.text(),
            name=message.name,
            tool_calls=None
            if message.tool_calls is None
            else [call.model_dump(exclude_none=True) for call in message.tool_calls],
            tool_call_id=message.tool_call_id,
        )
        for place, message in enumerate(messages)
    ]
