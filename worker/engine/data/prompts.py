"""What a prompt is and how a model reads it: a question (a table's row, an inline prompt, an
arithmetic problem) or a conversation up to the turn the student answers
(`conversations.py`), rendered by each model's own chat template, the assistant's turn
opened. A question becomes the user's turn (stripped, then its dataset's suffix); a
conversation is rendered as written, its tools passed to the template (a template that
has no place for tools leaves them out, as it would when serving; one that has no place
for an assistant's calls reads them as text, `reads_calls`). Training,
eval, every teacher and the playground render with these, so one conversation reads the
same to each model wherever it is rendered.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kernel.chats.conversation import ChatMessage, Conversation, ToolCall
from kernel.spec import PromptOptions

Prompt = str | Conversation
"""A question, or a conversation up to the turn the student answers."""


@dataclass(frozen=True)
class Prompts:
    """Prompts in the order the loop takes them, each with its reference answer (None
    where the source has none) and, from stored completions, the feedback given on it
    (what a self teacher with `context: feedback` reads); `left_out`: rows of the source
    left out for having none."""

    prompts: list[Prompt]
    answers: list[str | None]
    feedback: list[str | None] | None = None
    left_out: int = 0

    def __len__(self) -> int:
        return len(self.prompts)


def question_text(question: str, suffix: str) -> str:
    """A question as the user's turn says it: stripped, then its suffix."""
    return f"{question.strip()}\n\n{suffix}" if suffix else question.strip()


def as_chat(prompt: Prompt, options: PromptOptions) -> Conversation:
    """A prompt as a conversation: a question as the user's one turn, with its suffix."""
    if isinstance(prompt, Conversation):
        return prompt
    turn = ChatMessage(role="user", content=question_text(prompt, options.question_suffix))
    return Conversation.model_construct(messages=[turn], tools=None)


def render(tokenizer: Any, prompt: Prompt, options: PromptOptions) -> list[int]:
    """A prompt as prompt tokens by a tokenizer's chat template, as its dataset says."""
    chat = as_chat(prompt, options)
    calls = any(message.tool_calls for message in chat.messages)
    messages = chat.template_messages(calls_as_text=calls and not reads_calls(tokenizer))
    return build_chat(tokenizer, messages, options.enable_thinking, chat.template_tools())


CALL_PROBE = [
    {"role": "user", "content": "?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            ToolCall.model_validate(
                {"id": "probe", "function": {"name": "probe", "arguments": "{}"}}
            ).template()
        ],
    },
    {"role": "tool", "content": "!"},
]
templates_reading_calls: dict[str, bool] = {}


def reads_calls(tokenizer: Any) -> bool:
    """Whether a tokenizer's chat template writes an assistant's tool calls (its rendering
    of a call differs from the same turn without it), found once per template. One that
    does not (SmolLM2's) reads a call as its text, the same text a student answering with
    a call is compared with, so a conversation's calls are never dropped."""
    template = tokenizer.chat_template or ""
    if template not in templates_reading_calls:
        without = [{k: v for k, v in m.items() if k != "tool_calls"} for m in CALL_PROBE]
        renderings = [
            tokenizer.apply_chat_template(chat, tokenize=False) for chat in (CALL_PROBE, without)
        ]
        templates_reading_calls[template] = renderings[0] != renderings[1]
    return templates_reading_calls[template]


def build_prompt(tokenizer: Any, question: str, suffix: str, enable_thinking: bool) -> list[int]:
    """Render one question as chat-prompt tokens with the student's template."""
    return build_chat(
        tokenizer, [{"role": "user", "content": question_text(question, suffix)}], enable_thinking
    )


def build_chat(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    enable_thinking: bool,
    tools: list[dict[str, Any]] | None = None,
) -> list[int]:
    """Render a chat (and the tools it may call) as prompt tokens with a tokenizer's
    template, the assistant's turn opened."""
    text = tokenizer.apply_chat_template(
        messages,
        tools=tools,
        tokenize=False,
        add_generation_prompt=True,
        enable_thinking=enable_thinking,
    )
    prompt_ids = tokenizer.encode(text, add_special_tokens=False)
    if not prompt_ids:
        raise ValueError("Prompt tokens are empty")
    return list(prompt_ids)


def prompt_text(prompt: Prompt) -> str:
    """A prompt as a person reads it: the question, or each message as `role: text`."""
    return prompt if isinstance(prompt, str) else prompt.text()


def prompt_key(prompt: Prompt) -> str | tuple[str, str]:
    """A prompt as a cache's key: equal for equal prompts, a question's never a chat's."""
    return prompt if isinstance(prompt, str) else ("chat", prompt.key())
