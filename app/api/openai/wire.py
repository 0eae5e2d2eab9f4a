"""OpenAI's chat-completions wire format, and how it maps onto the playground's request and
answer (kernel/playground.py). A chat's messages and tools are a conversation
(kernel/chats), rendered as training renders one. Only what the playground can honour is
accepted: anything else (penalties, top-k logprobs, a `tool_choice` but `auto`) is a 400
that names it, not silently ignored."""

from __future__ import annotations

import json
import math
import time
import uuid
from collections.abc import Iterator
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from app.api.openai.names import ModelName
from app.core.pages import ObjectList
from app.stored_completions.schemas import Store, StoredMetadata
from kernel.chats.conversation import ChatMessage, Tool
from kernel.json_types import JsonModel
from kernel.playground import (
    MAX_MESSAGES,
    MAX_PLAYGROUND_TOKENS,
    MAX_SAMPLES,
    MAX_TIMEOUT_SECONDS,
    Completion,
    ModelOutput,
    SampleAnswer,
    SampleRequest,
)

FLOOR_LOGPROB = -9999.0
"""A logprob that is not finite (a token the model gives no chance) travels as this, as
OpenAI's own API and vLLM send it: the wire format has no null logprob."""
FINISH_REASONS = {"length": "length"}
"""Backend stop reasons OpenAI spells differently; every other reason is a `stop`."""


WorkerTimeout = Annotated[
    float | None,
    Field(
        gt=0,
        le=MAX_TIMEOUT_SECONDS,
        description="This service's own: how long to wait for a worker (default "
        "OPD_SAMPLE_TIMEOUT); the `openai` package sends it with extra_body.",
    ),
]
"""A door's `timeout_seconds`, the same for chat and text completions."""
Temperature = Annotated[
    float | None, Field(ge=0.0, le=2.0, description="0..2, as OpenAI bounds it; 0 = greedy.")
]
TopP = Annotated[float | None, Field(gt=0.0, le=1.0, description="Above 0, at most 1.")]
Choices = Annotated[
    int | None, Field(ge=1, le=MAX_SAMPLES, description=f"1..{MAX_SAMPLES} completions.")
]
Penalty = Annotated[
    float | None,
    Field(ge=-2.0, le=2.0, description="OpenAI's -2..2; only 0 (no penalty) is supported."),
]
"""The sampling parameters OpenAI bounds, bounded alike on both doors (temperature, top_p,
n, penalties); `max_tokens` and `stop` take the playground's bounds."""


class Strict(JsonModel):
    """A request's part: no field it does not know, each of JSON's type its schema says."""

    model_config = ConfigDict(extra="forbid")


class StreamOptions(Strict):
    include_usage: bool = False


class ChatCompletionRequest(Strict):
    """`POST /v1/chat/completions`. Bounds are the playground's (at most 16 completions,
    4096 tokens each, 4 stop strings); `max_tokens` defaults to 256."""

    model: str = Field(
        max_length=64,
        description="`job-12`, `job-12@step-300`, `job-12:teacher`, or an alias (`support-bot`).",
    )
    messages: list[ChatMessage] = Field(
        min_length=1,
        max_length=MAX_MESSAGES,
        description="OpenAI's messages, tool calls and a tool's replies too, rendered by the "
        "model's chat template as training renders a conversation.",
    )
    tools: list[Tool] | None = Field(
        None,
        description="Passed to the model's chat template, as training passes a "
        "conversation's; the answer is the model's text (a call it writes is not parsed "
        "into `tool_calls`).",
    )
    tool_choice: Literal["auto"] | None = Field(
        None, description="Only `auto`: the model chooses, as it does with tools given."
    )
    max_tokens: int | None = Field(None, ge=1, le=MAX_PLAYGROUND_TOKENS)
    max_completion_tokens: int | None = Field(
        None, ge=1, le=MAX_PLAYGROUND_TOKENS, description="The same as max_tokens."
    )
    temperature: Temperature = None
    top_p: TopP = None
    n: Choices = None
    stop: str | list[str] | None = None
    seed: int | None = Field(None, description="Passed to the backend's sampler.")
    logprobs: bool | None = Field(False, description="Each completion token's logprob.")
    top_logprobs: int | None = Field(
        None, ge=0, le=20, description="OpenAI's 0..20; only 0: no alternatives are returned."
    )
    frequency_penalty: Penalty = None
    presence_penalty: Penalty = None
    stream: bool | None = Field(
        False, description="SSE chunks, sent once the whole completion is ready."
    )
    stream_options: StreamOptions | None = None
    user: str | None = Field(None, description="Accepted and not used.")
    timeout_seconds: WorkerTimeout = None
    store: Store = False
    metadata: StoredMetadata = None

    @field_validator("top_logprobs", "frequency_penalty", "presence_penalty")
    @classmethod
    def _only_zero(cls, value: float | None) -> float | None:
        if value:
            raise ValueError("only 0 is supported")
        return value

    def playground_request(self, name: ModelName) -> SampleRequest:
        """The playground request this asks for (pydantic's ValidationError, naming the
        field, when a value is beyond the playground's bounds)."""
        given = self.model_dump(
            include={"n", "temperature", "top_p", "seed", "timeout_seconds"}, exclude_none=True
        )
        max_tokens = self.max_completion_tokens or self.max_tokens
        stop = [self.stop] if isinstance(self.stop, str) else self.stop
        return SampleRequest.model_validate(
            given
            | ({} if max_tokens is None else {"max_tokens": max_tokens})
            | ({} if stop is None else {"stop": stop})
            | {
                "messages": [m.model_dump(exclude_none=True) for m in self.messages],
                "tools": None
                if self.tools is None
                else [tool.model_dump(exclude_none=True) for tool in self.tools],
                "checkpoint": name.checkpoint,
                "model": name.role,
            }
        )


class TokenLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None
    top_logprobs: list[Any] = Field(default_factory=list)


class ChoiceLogprobs(BaseModel):
    content: list[TokenLogprob]
    refusal: None = None


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str
    refusal: None = None


class Choice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: ChoiceLogprobs | None
    finish_reason: Literal["stop", "length"]


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: Usage


class Delta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChunkChoice(BaseModel):
    index: int
    delta: Delta
    logprobs: ChoiceLogprobs | None = None
    finish_reason: Literal["stop", "length"] | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None


class Model(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(description="When its weights were saved (Unix time).")
    owned_by: str = Field(description="The team whose job it is.")


class ModelList(ObjectList[Model]):
    """One page of models: while `has_more`, pass `last_id` as `after` for the next."""


def token_logprobs(completion: Completion) -> ChoiceLogprobs:
    return ChoiceLogprobs(
        content=[
            TokenLogprob(
                token=token,
                logprob=FLOOR_LOGPROB if value is None or not math.isfinite(value) else value,
                bytes=list(token.encode()),
            )
            for token, value in zip(completion.tokens, completion.logprobs, strict=True)
        ]
    )


def chat_completion_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex}"


def chat_completion(model: str, answer: SampleAnswer, logprobs: bool) -> ChatCompletion:
    """The answer's completions by the model asked for (its first output), as choices."""
    return output_completion(chat_completion_id(), model, answer.outputs[0], logprobs)


def output_completion(
    completion_id: str, model: str, output: ModelOutput, logprobs: bool
) -> ChatCompletion:
    """One model's completions as a chat completion's choices, its usage its own prompt
    (as its tokenizer read it) and completions."""
    completions = output.completions
    sampled = sum(len(completion.token_ids) for completion in completions)
    return ChatCompletion(
        id=completion_id,
        created=int(time.time()),
        model=model,
        choices=[
            Choice(
                index=index,
                message=AssistantMessage(content=completion.text),
                logprobs=token_logprobs(completion) if logprobs else None,
                finish_reason=FINISH_REASONS.get(completion.stop_reason, "stop"),
            )
            for index, completion in enumerate(completions)
        ],
        usage=Usage(
            prompt_tokens=output.prompt_tokens,
            completion_tokens=sampled,
            total_tokens=output.prompt_tokens + sampled,
        ),
    )


def stream_events(completion: ChatCompletion, include_usage: bool) -> Iterator[str]:
    """The completion as OpenAI's SSE stream: per choice a chunk with its role, text and
    logprobs and one with its finish reason; the usage chunk when asked; `[DONE]`."""
    head = {"id": completion.id, "created": completion.created, "model": completion.model}
    for choice in completion.choices:
        parts = [
            ChunkChoice(
                index=choice.index,
                delta=Delta(role="assistant", content=choice.message.content),
                logprobs=choice.logprobs,
            ),
            ChunkChoice(index=choice.index, delta=Delta(), finish_reason=choice.finish_reason),
        ]
        for part in parts:
            yield event(ChatCompletionChunk(**head, choices=[part]))
    if include_usage:
        yield event(ChatCompletionChunk(**head, choices=[], usage=completion.usage))
    yield "data: [DONE]\n\n"


def event(chunk: ChatCompletionChunk) -> str:
    return f"data: {json.dumps(chunk.model_dump(mode='json'))}\n\n"
