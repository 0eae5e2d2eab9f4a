"""Built-in tiny models and their byte-level tokenizer, made in process (no files, no network).
The arithmetic presets (`trained.py`) share the tokenizer and the Qwen3 configuration; one
of them (`OWN_TEMPLATES`) renders chats with a chat template of its own, and one
(`arith-teacher-bpe`) has a tokenizer of its own (`bpe_tokenizer`): a BPE with merges for
numbers and the task's frequent words, other special tokens and another chat template.

Every test and the offline demo train these: a Qwen3-architecture student and teacher
initialised from fixed seeds, sharing a tokenizer in which each UTF-8 byte is one token.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

from kernel.model_names import ARITH_TEACHER_BPE, ARITH_TEACHER_TEMPLATE, TINY_PRESETS, TINY_TEACHER
from worker.engine.backends.byte_level import bytes_to_unicode
from worker.engine.backends.byte_tokenizer import CHAT_TEMPLATE, byte_level_bpe, tiny_tokenizer

SEEDED_INIT = threading.Lock()
"""Seeded construction draws from torch's process-wide generator, so it runs one at a time
across threads: a worker's playground loads models while its jobs train."""


@contextmanager
def drawing_alone() -> Iterator[None]:
    """Draw from torch's process-wide generator with no other thread drawing (SEEDED_INIT),
    leaving it as found. Every draw a worker's threads make must hold it, seeded or not: an
    adapter read from saved weights initialises its layers before loading them, and one
    drawn while another thread builds a preset gave that preset other weights."""
    with SEEDED_INIT, torch.random.fork_rng(devices=[]):
        yield


# Both models share one random base drawn at a large init scale (so their next-token
# distributions are far from uniform); the teacher adds a random low-rank change to every
# attention and MLP projection, which a rank >= 4 LoRA on the student can learn.
INIT_SCALE = 0.2
BASE_SEED = 1234
TEACHER_SEED = 5678
TEACHER_RANK = 4

# The same tokens in another frame: a system line, and other names for the two roles.
SYSTEM_CHAT_TEMPLATE = (
    "{{- '<|im_start|>system\\nYou are a calculator. Put the answer in a box.<|im_end|>\\n' }}"
    "{%- for message in messages %}"
    "{%- set role = {'user': 'question', 'assistant': 'answer'}.get(message['role'], "
    "message['role']) %}"
    "{{- '<|im_start|>' + role + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>answer\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif %}"
    "{%- endif %}"
)
OWN_TEMPLATES = {ARITH_TEACHER_TEMPLATE: SYSTEM_CHAT_TEMPLATE}
"""Presets whose chat template is not CHAT_TEMPLATE: same tokenizer, another rendering."""


def preset_tokenizer(name: str) -> PreTrainedTokenizerFast:
    """The tokenizer of preset `name`: the byte-level one with the preset's chat template,
    or arith-teacher-bpe's own."""
    if name == ARITH_TEACHER_BPE:
        return bpe_tokenizer()
    return tiny_tokenizer(OWN_TEMPLATES.get(name, CHAT_TEMPLATE))


BPE_EOS = "<|end|>"
BPE_PAD = "<pad>"
BPE_SPECIALS = [BPE_PAD, "<|user|>", "<|bot|>", BPE_EOS]
BPE_CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- ('<|user|>' if message['role'] == 'user' else '<|bot|>') + message['content'] + "
    "'<|end|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|bot|>' }}{%- endif %}"
)
"""No system line, no newlines after the role, no think block: another frame entirely."""
BPE_WORDS = ["What", " is", "Answer", " in", "\\boxed{", "}.", "?\n\n"]
"""Frequent pieces of the task's text that become one token each (built left to right)."""


def bpe_merges() -> list[tuple[str, str]]:
    """arith-teacher-bpe's merges, in rank order: every number 10..99 as one token (so a
    two-digit answer is one teacher token but two student bytes), then the words."""
    table = bytes_to_unicode()
    merges = [(str(a), str(b)) for a in range(1, 10) for b in range(10)]
    for word in BPE_WORDS:
        pieces = [table[byte] for byte in word.encode()]
        for end in range(2, len(pieces) + 1):
            merges.append(("".join(pieces[: end - 1]), pieces[end - 1]))
    return list(dict.fromkeys(merges))


def bpe_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level BPE: ids 0..255 the bytes, then the merged tokens, then four special
    tokens of its own (`<|end|>` ends a turn); its chat template is BPE_CHAT_TEMPLATE."""
    return byte_level_bpe(bpe_merges(), BPE_SPECIALS, BPE_EOS, BPE_PAD, BPE_CHAT_TEMPLATE)


TINY_SIZES: dict[str, int | float] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "initializer_range": INIT_SCALE,
}
"""A two-layer Qwen3 with hidden size 64: trains on a CPU in milliseconds per step."""


def preset_config(tokenizer: PreTrainedTokenizerFast, **sizes: int | float) -> Qwen3Config:
    """A Qwen3 over the byte-level tokenizer: the tiny sizes unless `sizes` says otherwise."""
    return Qwen3Config(
        **(TINY_SIZES | sizes),
        vocab_size=len(tokenizer),
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )


def tiny_model(name: str) -> Qwen3ForCausalLM:
    """The preset `name` (tiny-student or tiny-teacher), identical on every call."""
    if name not in TINY_PRESETS:
        raise ValueError(f"unknown preset {name!r}; presets are {', '.join(TINY_PRESETS)}")
    with drawing_alone():
        torch.manual_seed(BASE_SEED)
        model = Qwen3ForCausalLM(preset_config(tiny_tokenizer()))
        if name == TINY_TEACHER:
            torch.manual_seed(TEACHER_SEED)
            perturb_projections(model, TEACHER_RANK)
    model.name_or_path = model.config.name_or_path = name
    return model.eval()


@torch.no_grad()
def perturb_projections(model: torch.nn.Module, rank: int) -> None:
    """Add a random rank-`rank` matrix to each linear layer except the output head."""
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and name != "lm_head":
            rows, cols = module.weight.shape
            left = torch.randn(rows, rank) / rank**0.5
            right = torch.randn(rank, cols) / rank**0.5
            module.weight += INIT_SCALE * (left @ right)
