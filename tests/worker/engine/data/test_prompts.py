"""A prompt as a model reads it: a question as the user's turn with its suffix, a
conversation as written, its tools passed to the template and, where the template has no
place for an assistant's calls, the calls as text. One conversation renders to the same
tokens in training (a file's prompts, `Renderer`), in the playground and through
`/v1/chat/completions` (the OpenAI door's request, mapped onto the playground's), on
SmolLM2's template and the presets'."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from app.api.openai.names import parse_model
from app.api.openai.wire import ChatCompletionRequest
from kernel.chats.conversation import Conversation
from kernel.model_names import ARITH_TEACHER_TEMPLATE, SMOLLM2, chat_tokens
from kernel.playground import SampleTask
from kernel.spec import JobSpec, PromptOptions
from kernel.spec.teachers import SelfExample, SelfTeacher
from kernel.tables.bounds import TableLimits
from tests.chats import OPENAI_FILE, SUFFIX, SYSTEM, answer, user, write_jsonl
from tests.support import converted_smollm2
from worker.engine.backends.local.models import ModelCache, load_tokenizer
from worker.engine.backends.local.presets import CHAT_TEMPLATE, preset_tokenizer, tiny_tokenizer
from worker.engine.data.conversations import file_prompts
from worker.engine.data.prompts import build_prompt, reads_calls, render
from worker.engine.playground import render as playground_render
from worker.engine.teachers.views import REFERENCE_LINE, Renderer

TOOLS_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>tools\\n' }}{%- for tool in tools %}"
    "{{- tool.function.name + '\\n' }}{%- endfor %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + message.content }}"
    "{%- for call in message.tool_calls or [] %}{{- 'call ' + call.function.name }}{%- endfor %}"
    "{{- '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
"""ChatML that lists the tools and writes each call, as Qwen's and Llama 3's templates do."""


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return load_tokenizer(SMOLLM2, ModelCache(converted_smollm2(tmp_path_factory)))


def tokenizers(smollm2: Any) -> dict[str, Any]:
    return {
        "smollm2": smollm2,
        "arith-student": preset_tokenizer("arith-student"),
        ARITH_TEACHER_TEMPLATE: preset_tokenizer(ARITH_TEACHER_TEMPLATE),
        "tools": tiny_tokenizer(TOOLS_TEMPLATE),
    }


def training_prompts(tmp_path: Path) -> tuple[JobSpec, list[Conversation]]:
    """The hand-written file's prompts as a job reads them (turns: each)."""
    path = write_jsonl(tmp_path / "root" / "train.jsonl", OPENAI_FILE)
    spec = JobSpec.model_validate(
        {
            "backend": "local",
            "student": {"base_model": "arith-student"},
            "teacher": {"base_model": "arith-teacher"},
            "dataset": {"source": "file", "path": "train.jsonl", "turns": "each"},
        }
    )
    prompts = file_prompts(path, "jsonl", "messages", spec.dataset, TableLimits())
    assert all(isinstance(prompt, Conversation) for prompt in prompts.prompts)
    return spec, prompts.prompts  # type: ignore[return-value]


def as_openai_request(chat: Conversation) -> SampleTask:
    """The chat sent to /v1/chat/completions by an OpenAI client, as the door hands it to a
    worker."""
    body = ChatCompletionRequest.model_validate(
        {
            "model": "job-1",
            "messages": [m.model_dump(exclude_none=True) for m in chat.messages],
            **({"tools": chat.template_tools()} if chat.tools else {}),
        }
    )
    return body.playground_request(parse_model(body.model))  # type: ignore[arg-type,return-value]


def test_one_conversation_renders_alike_in_training_and_through_the_openai_door(tmp_path, smollm2):
    spec, prompts = training_prompts(tmp_path)
    assert len(prompts) == 8
    for name, tokenizer in tokenizers(smollm2).items():
        trained = Renderer(tokenizer)
        for prompt in prompts:
            request = as_openai_request(prompt)
            task = SampleTask(
                request=request, spec=spec, weights_path="w", deadline=time.time() + 60
            )
            assert playground_render(task, tokenizer) == trained(prompt, spec.dataset), name


def test_the_tools_reach_a_template_that_takes_them_and_calls_read_as_text_elsewhere(
    tmp_path, smollm2
):
    spec, prompts = training_prompts(tmp_path)
    after_the_reply = next(p for p in prompts if p.messages[-1].role == "tool")
    named = tokenizers(smollm2)
    tools = named["tools"].decode(render(named["tools"], after_the_reply, spec.dataset))
    assert tools.startswith("<|im_start|>tools\nmultiply\n") and "call multiply" in tools
    assert reads_calls(named["tools"]) and not reads_calls(smollm2)
    for name in ("smollm2", "arith-student"):
        text = named[name].decode(render(named[name], after_the_reply, spec.dataset))
        assert '{"name": "multiply", "arguments": {"a": 7, "b": 6}}' in text, name
        assert "<|im_start|>tool\n42<|im_end|>" in text and "tools\n" not in text, name


def test_smollm2_reads_the_files_system_line_instead_of_its_own(tmp_path, smollm2):
    spec, prompts = training_prompts(tmp_path)
    with_system = next(
        p for p in prompts if len(p.messages) > 2 and p.messages[2].text() == "\\boxed{5}"
    )
    without = next(p for p in prompts if p.messages[0].role == "user")
    first = smollm2.decode(render(smollm2, with_system, spec.dataset))
    assert first.startswith("<|im_start|>system\nYou are a careful calculator.<|im_end|>")
    assert "SmolLM" not in first and "<|im_start|>assistant\n\\boxed{5}<|im_end|>" in first
    assert "SmolLM" in smollm2.decode(render(smollm2, without, spec.dataset))


def test_a_self_teachers_context_goes_where_the_template_puts_a_system_line():
    context = SelfTeacher(
        system="Check your sum.",
        examples=[SelfExample(user="What is 1 + 1?", assistant="\\boxed{2}")],
        reference=True,
    )
    tokenizer = preset_tokenizer("arith-student")
    chat = Conversation.model_validate(
        {"messages": [SYSTEM, user("What is 2 + 3?"), answer(5), user("What is 4 + 4?")]}
    )
    text = tokenizer.decode(Renderer(tokenizer, context)(chat, PromptOptions(), "\\boxed{8}"))
    assert text.startswith(
        "<|im_start|>system\nYou are a careful calculator.\n\nCheck your sum.<|im_end|>\n"
        "<|im_start|>user\nWhat is 1 + 1?<|im_end|>\n<|im_start|>assistant\n\\boxed{2}<|im_end|>\n"
        "<|im_start|>user\nWhat is 2 + 3?"
    )
    assert text.count("<|im_start|>system") == 1
    last_turn = f"What is 4 + 4?{SUFFIX}\n\n{REFERENCE_LINE}\\boxed{{8}}<|im_end|>\n"
    assert text.endswith(last_turn + "<|im_start|>assistant\n<think>\n\n</think>\n\n")
    question = tokenizer.decode(
        Renderer(tokenizer, context)("What is 4 + 4?", PromptOptions(question_suffix=""), "8")
    )
    assert question.startswith(
        "<|im_start|>system\nCheck your sum.<|im_end|>\n<|im_start|>user\nWhat is 1 + 1?"
    )


def test_a_question_is_the_users_one_turn_with_its_suffix_and_a_conversation_takes_none():
    tokenizer = tiny_tokenizer()
    options = PromptOptions(question_suffix="Box it.")
    assert render(tokenizer, "  What is 2+2?  ", options) == build_prompt(
        tokenizer, "What is 2+2?", "Box it.", False
    )
    chat = Conversation.model_validate({"messages": [{"role": "user", "content": "What is 2+2?"}]})
    assert tokenizer.decode(render(tokenizer, chat, options)).startswith(
        "<|im_start|>user\nWhat is 2+2?<|im_end|>"
    )


def test_the_byte_level_count_of_a_chat_holds_to_the_tokenizer():
    tokenizer = tiny_tokenizer(CHAT_TEMPLATE)
    chat = Conversation.model_validate(OPENAI_FILE[1])
    messages = chat.template_messages(calls_as_text=True)
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    counted = chat_tokens("arith-student", ((m["role"], m["content"]) for m in messages))
    assert counted == len(tokenizer.encode(text, add_special_tokens=False))
    assert chat_tokens(ARITH_TEACHER_TEMPLATE, []) is None and chat_tokens(SMOLLM2, []) is None


@pytest.fixture
def tokenizer():
    return tiny_tokenizer()


def test_prompt_joins_question_and_suffix_with_a_blank_line(tokenizer) -> None:
    ids = build_prompt(tokenizer, "  What is 2+2?  ", "Box it.", enable_thinking=True)

    assert tokenizer.decode(ids) == (
        "<|im_start|>user\nWhat is 2+2?\n\nBox it.<|im_end|>\n<|im_start|>assistant\n"
    )


def test_prompt_without_suffix_is_the_stripped_question(tokenizer) -> None:
    ids = build_prompt(tokenizer, "Hi\n", "", enable_thinking=True)

    assert tokenizer.decode(ids) == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


def test_enable_thinking_reaches_the_chat_template(tokenizer) -> None:
    thinking = build_prompt(tokenizer, "Hi", "", enable_thinking=True)
    no_thinking = build_prompt(tokenizer, "Hi", "", enable_thinking=False)

    assert tokenizer.decode(no_thinking) == tokenizer.decode(thinking) + "<think>\n\n</think>\n\n"
