"""One conversation, as OpenAI's fine-tuning format writes it (TRL's `messages` is the same
shape): its messages (system, developer, user, assistant, tool), an assistant's tool calls
and a tool's reply to one, OpenAI's `weight` of an assistant turn, and the tools it may
call; held to the rules OpenAI's fine-tuning validator holds a line to (a known role, text
content, a user turn, each tool reply answering a call, a call's arguments a JSON object,
a weight of 0 or 1), each refusal naming its field.

Where a conversation is a prompt (`points`): before each assistant turn that is trained on
(weight 1, the default), after a user turn, the messages before it are what a model reads
and the turn is the reference answer; a conversation that ends with a user's or a tool's
message is also a prompt as a whole (TRL's prompt-only rows), with no reference.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from kernel.json_types import JsonModel
from kernel.spec.base import field_error
from kernel.spec.data import Turns
from kernel.wording import shown

Role = Literal["system", "developer", "user", "assistant", "tool"]
ChatFormat = Literal["messages", "prompt_completion", "prompt"]
"""The shapes a file of conversations takes (here, not beside the files' reader, so the
SDK's schemas name it without pyarrow)."""
MAX_MESSAGES = 1024
MAX_NAME_CHARS = 256
OPEN_ENDED = ("user", "tool")
"""Roles after which a conversation's end is a prompt: the next turn is the assistant's."""


class ChatPart(JsonModel):
    """A part of a conversation: no field it does not know, each of JSON's type."""

    model_config = ConfigDict(extra="forbid")


class TextPart(ChatPart):
    type: Literal["text"]
    text: str


Content = str | list[TextPart] | None


def content_text(content: Content) -> str:
    """A message's content as text: a list of text parts joined by newlines (as the chat
    completions door joins them), none as empty."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "\n".join(part.text for part in content)


class FunctionCall(ChatPart):
    name: str = Field(min_length=1, max_length=MAX_NAME_CHARS)
    arguments: str | dict[str, Any] = Field(
        description="The arguments by name: a JSON object, as text (OpenAI) or as itself (TRL)."
    )

    @field_validator("arguments")
    @classmethod
    def _a_json_object(cls, arguments: str | dict[str, Any]) -> str | dict[str, Any]:
        if isinstance(arguments, dict):
            return arguments
        try:
            parsed = json.loads(arguments)
        except json.JSONDecodeError as error:
            raise ValueError(f"is not valid JSON ({error.msg} at character {error.pos})") from None
        except (ValueError, RecursionError):  # a number past 4,300 digits, nesting too deep
            raise ValueError("is JSON this service does not read") from None
        if not isinstance(parsed, dict):
            raise ValueError(
                f"should be a JSON object of the arguments by name, not {shown(parsed)}"
            )
        return arguments

    def parsed(self) -> dict[str, Any]:
        return self.arguments if isinstance(self.arguments, dict) else json.loads(self.arguments)


class ToolCall(ChatPart):
    id: str | None = Field(None, max_length=MAX_NAME_CHARS)
    type: Literal["function"] = "function"
    function: FunctionCall

    def template(self) -> dict[str, Any]:
        """As chat templates read a call (transformers' form: the arguments as a mapping)."""
        call = {"name": self.function.name, "arguments": self.function.parsed()}
        named = {} if self.id is None else {"id": self.id}
        return {"type": "function", **named, "function": call}


class ChatMessage(ChatPart):
    role: Role
    content: Content = Field(
        None,
        description="Text, or a list of text parts; only an assistant turn that calls a "
        "tool may leave it out.",
    )
    name: str | None = Field(None, max_length=MAX_NAME_CHARS)
    tool_calls: list[ToolCall] | None = Field(None, min_length=1, description="An assistant's.")
    tool_call_id: str | None = Field(
        None, max_length=MAX_NAME_CHARS, description="A tool's: the call it answers."
    )
    weight: Literal[0, 1] | None = Field(
        None,
        description="An assistant's: 1 (default) a turn the student answers, 0 one it only reads.",
    )

    @model_validator(mode="after")
    def _fits_its_role(self) -> ChatMessage:
        if self.tool_calls is not None and self.role != "assistant":
            raise field_error(("tool_calls",), "only an assistant turn calls tools")
        if self.weight is not None and self.role != "assistant":
            raise field_error(("weight",), "only an assistant turn has a weight")
        if self.tool_call_id is not None and self.role != "tool":
            raise field_error(("tool_call_id",), "only a tool's reply answers a call")
        if self.content is None and self.tool_calls is None:
            raise field_error(
                ("content",),
                "this field is required (only an assistant turn that calls a tool may leave "
                "it out)",
            )
        return self

    @property
    def trained(self) -> bool:
        """An assistant turn the student answers (weight 1, the default)."""
        return self.role == "assistant" and self.weight != 0

    def text(self) -> str:
        return content_text(self.content)

    def template(self, calls_as_text: bool = False) -> dict[str, Any]:
        """The message as chat templates read it: text content (empty, not null, beside a
        call; with `calls_as_text`, for a template that has no place for calls, the calls
        as its reference writes them), a developer's as a system line, calls in
        transformers' form."""
        message: dict[str, Any] = {
            "role": "system" if self.role == "developer" else self.role,
            "content": self.reference() if calls_as_text else self.text(),
        }
        if self.tool_calls:
            message["tool_calls"] = [call.template() for call in self.tool_calls]
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            message["name"] = self.name
        return message

    def reference(self) -> str:
        """An assistant turn as a reference answer: its text, else its calls as JSON, one a
        line (what a student answering with a call is compared with)."""
        if self.text() or not self.tool_calls:
            return self.text()
        return "\n".join(
            json.dumps({"name": call.function.name, "arguments": call.function.parsed()})
            for call in self.tool_calls
        )


class FunctionTool(ChatPart):
    name: str = Field(min_length=1, max_length=MAX_NAME_CHARS)
    description: str | None = None
    parameters: dict[str, Any] | None = Field(None, description="A JSON Schema.")
    strict: bool | None = None


class Tool(ChatPart):
    type: Literal["function"] = "function"
    function: FunctionTool


class Conversation(ChatPart):
    """A conversation and the tools its assistant may call."""

    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
    tools: list[Tool] | None = None

    @model_validator(mode="after")
    def _a_user_and_answered_calls(self) -> Conversation:
        if not any(message.role == "user" for message in self.messages):
            raise field_error(("messages",), "has no user turn (a conversation needs one)")
        pending: list[ToolCall] = []
        for index, message in enumerate(self.messages):
            if message.role != "tool":
                pending = list(message.tool_calls or [])
                continue
            if not pending:
                raise field_error(
                    ("messages", index),
                    "a tool's reply answers no call: it must follow the assistant turn whose "
                    "call it answers",
                )
            if message.tool_call_id is None:
                pending.pop(0)
                continue
            answered = [call for call in pending if call.id == message.tool_call_id]
            if not answered:
                ids = ", ".join(repr(call.id) for call in pending if call.id) or "none with an id"
                raise field_error(
                    ("messages", index, "tool_call_id"),
                    f"{message.tool_call_id!r} answers no call of the assistant turn before "
                    f"it (its calls left unanswered: {ids})",
                )
            pending.remove(answered[0])
        return self

    def points(self, turns: Turns) -> list[int]:
        """Where the conversation is a prompt, as `prompt(point)` cuts it: before each
        trained assistant turn after a user turn, and at its end if it ends with a user's
        or a tool's message; `last`: the last of them only."""
        points, asked = [], False
        for index, message in enumerate(self.messages):
            if message.trained and asked:
                points.append(index)
            asked = asked or message.role == "user"
        if self.messages[-1].role in OPEN_ENDED:
            points.append(len(self.messages))
        return points[-1:] if turns == "last" else points

    def prompt(self, point: int) -> Conversation:
        """The messages before `point`, with the tools: what the student reads."""
        return Conversation.model_construct(messages=self.messages[:point], tools=self.tools)

    def reference(self, point: int) -> str | None:
        """The turn at `point` as a reference answer; None at the end."""
        return self.messages[point].reference() if point < len(self.messages) else None

    def template_messages(self, calls_as_text: bool = False) -> list[dict[str, Any]]:
        return [message.template(calls_as_text) for message in self.messages]

    def template_tools(self) -> list[dict[str, Any]] | None:
        """The tools as chat templates take them (OpenAI's form), None without any."""
        if not self.tools:
            return None
        return [tool.model_dump(exclude_none=True) for tool in self.tools]

    def text(self) -> str:
        """The conversation as a person reads it: each message as `role: text`."""
        return "\n".join(
            f"{message.role}: {message.text() or message.reference()}" for message in self.messages
        )

    def key(self) -> str:
        """The conversation as one string, equal for equal conversations."""
        return self.model_dump_json(exclude_none=True)
