"""Stored completions at OpenAI's doors: what a completion served with `store: true` keeps
(the request's conversation and settings, the answer as sent, each choice's token ids and
logprobs, the team's metadata), and how it reads back in OpenAI's shapes (a chat
completion with its `metadata`, and this service's `feedback` beside; its messages; a
deletion). A text completion (`/v1/completions`) is kept as a chat of one user turn, its
prompt as the model read it, so that the same doors read it; the playground's `store`
keeps each model it asked as the chat door keeps that model's, one row each."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, Field
from sqlalchemy.ext.asyncio import AsyncSession

from app.api.openai.completions import CompletionRequest, TextCompletion
from app.api.openai.names import ModelName
from app.api.openai.wire import (
    AssistantMessage,
    ChatCompletion,
    ChatCompletionRequest,
    Choice,
    Strict,
    chat_completion_id,
    output_completion,
)
from app.core.config import Settings
from app.core.pages import ObjectList
from app.playground.schemas import PlaygroundAnswer, PlaygroundRequest
from app.playground.service import Served
from app.stored_completions.schemas import FeedbackPublic, feedback_id
from app.stored_completions.store import Given, add_completions, check_room
from app.stored_completions.tables import Feedback, StoredCompletion
from kernel.chats.conversation import ChatMessage
from kernel.playground import Completion

R = TypeVar("R", bound=BaseModel)

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


@dataclass
class Keeping:
    """A request's `store: true`: the team's room for the `adding` completions it keeps
    checked before it samples (StoredQuotaExceeded past its quota: nothing sampled or
    billed), the answers seen as the response is made, and the completions kept once
    served (a replay of a kept answer keeps nothing more)."""

    session: AsyncSession
    store: bool
    answers: list[PlaygroundAnswer] = field(default_factory=list)

    @classmethod
    async def of(
        cls, session: AsyncSession, settings: Settings, team_id: int, store: bool, adding: int = 1
    ) -> Keeping:
        if store:
            await check_room(session, team_id, settings.team_max_stored_completions, adding)
        return cls(session, store)

    def seen(
        self, respond: Callable[[list[PlaygroundAnswer]], R]
    ) -> Callable[[list[PlaygroundAnswer]], R]:
        def answered(answers: list[PlaygroundAnswer]) -> R:
            self.answers = answers
            return respond(answers)

        return answered

    async def keep(
        self,
        served: Served[Any],
        rows: Callable[[list[PlaygroundAnswer]], list[StoredCompletion]],
    ) -> None:
        if self.store and not served.replayed:
            await add_completions(self.session, rows(self.answers))


def choice_tokens(completions: Iterable[Completion]) -> list[dict[str, Any]]:
    """Each choice's token ids and logprobs, in the order the choices were answered."""
    return [
        {"token_ids": completion.token_ids, "logprobs": completion.logprobs}
        for completion in completions
    ]


def first_completions(answers: list[PlaygroundAnswer]) -> list[Completion]:
    """The completions of the model a door asked for (each answer's first output)."""
    return [completion for answer in answers for completion in answer.outputs[0].completions]


def chat_row(
    team_id: int,
    job_id: int,
    body: ChatCompletionRequest,
    completion: ChatCompletion,
    answers: list[PlaygroundAnswer],
) -> StoredCompletion:
    """What a chat completion served with `store: true` keeps."""
    request = body.model_dump(include={"messages", "tools", *SETTINGS}, exclude_none=True)
    labels = Labels(team_id, job_id, body.model, body.metadata)
    return kept("chat", labels, request, completion, first_completions(answers))


@dataclass(frozen=True)
class Labels:
    """Whose a stored completion is, the `model` it is listed under, and its metadata."""

    team_id: int
    job_id: int
    model: str
    metadata: dict[str, str] | None


def kept(
    kind: str,
    labels: Labels,
    request: dict[str, Any],
    completion: ChatCompletion,
    completions: Iterable[Completion],
) -> StoredCompletion:
    return StoredCompletion(
        public_id=completion.id,
        team_id=labels.team_id,
        job_id=labels.job_id,
        model=labels.model,
        kind=kind,
        request=request,
        response=completion.model_dump(mode="json"),
        tokens=choice_tokens(completions),
        metadata_=dict(labels.metadata or {}),
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
    labels = Labels(team_id, job_id, body.model, body.metadata)
    return kept("text", labels, request | one_turn(prompt), chat, first_completions(answers))


def one_turn(prompt: str) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": prompt}]}


def with_stored_ids(answers: list[PlaygroundAnswer]) -> PlaygroundAnswer:
    """The playground's answer, each model's output with the id of the stored completion
    that keeps it."""
    (answer,) = answers
    outputs = [
        output.model_copy(update={"stored_completion_id": chat_completion_id()})
        for output in answer.outputs
    ]
    return answer.model_copy(update={"outputs": outputs})


def playground_rows(
    team_id: int, body: PlaygroundRequest, answer: PlaygroundAnswer
) -> list[StoredCompletion]:
    """What a playground request with `store` keeps: each model's completions as
    `/v1/chat/completions` keeps them when that model is asked for by name (`job-12`,
    `job-12@step-300`, `job-12:teacher`, `job-12:base`), every token's logprob in its
    answer. A question or a chat is kept as a chat (a question as one user turn, as asked);
    a text or token ids as a text completion's prompt is, the prompt as each model read it;
    a teacher named among several (`teacher`) is kept with the settings."""
    settings = body.model_dump(include={*SETTINGS, "teacher"}, exclude_none=True)
    rows = []
    for output in answer.outputs:
        assert output.stored_completion_id is not None  # with_stored_ids named it
        name = str(ModelName(answer.job_id, body.checkpoint, output.model))
        completion = output_completion(output.stored_completion_id, name, output, logprobs=True)
        if body.messages is not None:
            kind, asked = "chat", body.model_dump(include={"messages", "tools"}, exclude_none=True)
        elif body.prompt is not None:
            kind, asked = "chat", one_turn(body.prompt)
        else:
            given = body.text if body.text is not None else body.prompt_token_ids
            kind, asked = "text", {"prompt": given} | one_turn(output.prompt)
        labels = Labels(team_id, answer.job_id, name, body.metadata)
        rows.append(kept(kind, labels, settings | asked, completion, output.completions))
    return rows


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
