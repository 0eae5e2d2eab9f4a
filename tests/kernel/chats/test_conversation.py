"""A conversation's rules, as OpenAI's fine-tuning validator holds a line to them, and where
it is a prompt: before each assistant turn trained on, after a user turn, and at an end
that awaits the assistant."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from kernel.chats.conversation import Conversation
from kernel.wording import problems
from tests.chats import INVALID_LINES, MULTIPLY, OPENAI_FILE, SYSTEM, answer, user


def conversation(*messages: dict, tools: list | None = None) -> Conversation:
    return Conversation.model_validate({"messages": list(messages), "tools": tools})


def test_the_last_turn_trained_on_is_the_prompt_and_each_gives_every_one():
    chat = conversation(
        SYSTEM, user("a"), answer(1, weight=0), user("b"), answer(2), user("c"), answer(3)
    )
    assert chat.points("each") == [4, 6] and chat.points("last") == [6]
    prompt = chat.prompt(4)
    assert [m.role for m in prompt.messages] == ["system", "user", "assistant", "user"]
    assert (chat.reference(4), chat.reference(6)) == ("\\boxed{2}", "\\boxed{3}")


def test_an_answer_before_any_user_turn_is_read_and_an_open_end_is_a_prompt_without_a_reference():
    chat = conversation(SYSTEM, answer(0), user("a"), answer(1), user("b"))
    assert chat.points("each") == [3, 5] and chat.points("last") == [5]
    assert chat.reference(5) is None
    assert conversation(user("a"), answer(1, weight=0)).points("each") == []


def test_a_call_is_a_turn_trained_on_whose_reference_is_the_call_as_json():
    chat = Conversation.model_validate(OPENAI_FILE[1])
    assert chat.points("each") == [2, 4]
    assert json.loads(chat.reference(2) or "") == {
        "name": "multiply",
        "arguments": {"a": 7, "b": 6},
    }
    templated = chat.template_messages()
    assert templated[2]["content"] == "" and templated[2]["tool_calls"][0]["function"] == {
        "name": "multiply",
        "arguments": {"a": 7, "b": 6},
    }
    assert chat.template_messages(calls_as_text=True)[2]["content"] == chat.reference(2)
    assert chat.template_tools() == [MULTIPLY]


def test_text_parts_are_joined_and_a_developer_line_is_a_system_line():
    chat = conversation(
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
    )
    assert chat.template_messages() == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "a\nb"},
    ]


@pytest.mark.parametrize(("row", "field", "words"), INVALID_LINES)
def test_each_refusal_of_openais_validator_names_its_field(row, field, words):
    with pytest.raises(ValidationError) as refused:
        Conversation.model_validate(row)
    found = problems(refused.value.errors(), Conversation)
    assert any(at == field and words in what for at, what in found), found


@pytest.mark.parametrize(
    ("message", "field", "words"),
    [
        (
            {"role": "user", "content": "q", "weight": 1},
            "messages.1.weight",
            "only an assistant turn",
        ),
        (
            {"role": "user", "content": "q", "tool_call_id": "c"},
            "messages.1.tool_call_id",
            "only a tool's",
        ),
        ({"role": "assistant"}, "messages.1.content", "this field is required"),
        ({"role": "user", "content": "q", "refusal": "no"}, "messages.1.refusal", "unknown field"),
    ],
)
def test_a_field_that_does_not_fit_its_role_is_refused(message, field, words):
    with pytest.raises(ValidationError) as refused:
        conversation(user("a"), message)
    found = problems(refused.value.errors(), Conversation)
    assert any(at == field and words in what for at, what in found), found


def test_a_reply_names_a_call_of_the_turn_before_it():
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "multiply", "arguments": {"a": 1, "b": 2}},
    }
    asked = {"role": "assistant", "tool_calls": [call]}
    conversation(user("a"), asked, {"role": "tool", "tool_call_id": "c1", "content": "2"})
    conversation(user("a"), asked, {"role": "tool", "content": "2"})  # TRL's: no id
    with pytest.raises(ValidationError, match="'c2' answers no call"):
        conversation(user("a"), asked, {"role": "tool", "tool_call_id": "c2", "content": "2"})
    with pytest.raises(ValidationError, match="answers no call"):
        conversation(
            user("a"), asked, {"role": "tool", "content": "2"}, {"role": "tool", "content": "3"}
        )
