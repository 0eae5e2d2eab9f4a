"""Conversations the tests share: a fine-tuning file written by hand as OpenAI's guide writes
one (a system line, two-turn chats whose first answer is only read, a tool call and its
reply, the tools), a TRL `messages` dataset, and files of each refusal OpenAI's validator
makes, with the line and field each must be named by. The arithmetic is the presets' task,
each question with the suffix they were trained to read, so a job on them is graded."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SUFFIX = "\n\nAnswer in \\boxed{}."
SYSTEM = {"role": "system", "content": "You are a careful calculator."}
MULTIPLY = {
    "type": "function",
    "function": {
        "name": "multiply",
        "description": "The product of two whole numbers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}


def user(question: str) -> dict[str, Any]:
    return {"role": "user", "content": question + SUFFIX}


def answer(value: int, weight: int | None = None) -> dict[str, Any]:
    turn: dict[str, Any] = {"role": "assistant", "content": f"\\boxed{{{value}}}"}
    return turn if weight is None else turn | {"weight": weight}


OPENAI_FILE: list[dict[str, Any]] = [
    {
        "messages": [
            SYSTEM,
            user("What is 2 + 3?"),
            answer(5, weight=0),
            user("What is 4 + 4?"),
            answer(8),
        ]
    },
    {
        "messages": [
            SYSTEM,
            user("What is 7 * 6?"),
            {
                "role": "assistant",
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "multiply", "arguments": '{"a": 7, "b": 6}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "42"},
            answer(42),
        ],
        "tools": [MULTIPLY],
    },
    {"messages": [user("What is 9 - 4?"), answer(5, weight=1), user("What is 9 + 4?"), answer(13)]},
    {"messages": [SYSTEM, user("What is 3 + 5?"), answer(8)]},
    {"messages": [user("What is 6 - 2?"), answer(4)]},
    {"messages": [user("What is 8 + 1?"), answer(9)]},
]
"""Six conversations: turns `last` gives six prompts, `each` eight (the first chat's
first answer weighs 0; the tool call is an assistant turn trained on)."""
OPENAI_LAST_REFERENCES = [
    "\\boxed{8}",
    "\\boxed{42}",
    "\\boxed{13}",
    "\\boxed{8}",
    "\\boxed{4}",
    "\\boxed{9}",
]
OPENAI_EACH = 8

TRL_MESSAGES: list[dict[str, Any]] = [
    {"messages": [user(f"What is {a} + {b}?"), answer(a + b)]}
    for a, b in [(1, 2), (3, 4), (5, 1), (2, 2), (6, 3), (7, 1)]
]
"""TRL's conversational language modeling: one user turn, one assistant turn."""

INVALID_LINES: list[tuple[Any, str, str]] = [
    (
        {"messages": [{"role": "bot", "content": "Hi"}, user("What is 1 + 1?")]},
        "messages.0.role",
        "should be 'system', 'developer', 'user', 'assistant' or 'tool', not \"bot\"",
    ),
    ({"messages": [SYSTEM, answer(2)]}, "messages", "has no user turn"),
    (
        {"messages": [{"role": "user", "content": 12}, answer(2)]},
        "messages.0.content",
        "should be a string or a list, not 12",
    ),
    (
        {"messages": [user("What is 1 + 1?"), {"role": "tool", "content": "2"}]},
        "messages.1",
        "a tool's reply answers no call",
    ),
    (
        {
            "messages": [
                user("What is 2 * 3?"),
                {
                    "role": "assistant",
                    "tool_calls": [
                        {
                            "id": "c",
                            "type": "function",
                            "function": {"name": "multiply", "arguments": "{a: 2"},
                        }
                    ],
                },
            ]
        },
        "messages.1.tool_calls.0.function.arguments",
        "is not valid JSON",
    ),
    (
        {"messages": [user("What is 1 + 1?"), answer(2, weight=2)]},
        "messages.1.weight",
        "should be 0 or 1, not 2",
    ),
]
"""One line of each refusal OpenAI's validator makes: the line, its field, the words."""


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def jsonl_bytes(rows: list[Any]) -> bytes:
    return "".join(json.dumps(row) + "\n" for row in rows).encode()
