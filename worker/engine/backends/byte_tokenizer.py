"""The built-in tiny models' tokenizer: each UTF-8 byte one token, then ChatML's
specials. Apart from the presets (which build the models with torch), so a process that
only tokenizes, such as a fake of a remote backend, does not load torch."""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from worker.engine.backends.byte_level import bytes_to_unicode

EOS_TOKEN = "<|im_end|>"
PAD_TOKEN = "<|endoftext|>"
SPECIAL_TOKENS = [PAD_TOKEN, "<|im_start|>", EOS_TOKEN]

# Qwen3's ChatML template, trimmed to plain messages: with enable_thinking false the
# assistant turn opens with an empty think block, exactly as Qwen3 renders it.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif %}"
    "{%- endif %}"
)


def tiny_tokenizer(chat_template: str = CHAT_TEMPLATE) -> PreTrainedTokenizerFast:
    """Byte-level tokenizer: ids 0..255 are the bytes, then the three ChatML specials."""
    return byte_level_bpe([], SPECIAL_TOKENS, EOS_TOKEN, PAD_TOKEN, chat_template)


def byte_level_bpe(
    merges: list[tuple[str, str]],
    specials: list[str],
    eos_token: str,
    pad_token: str,
    chat_template: str,
) -> PreTrainedTokenizerFast:
    """A byte-level BPE: ids 0..255 the bytes, then each merge's token, then `specials`."""
    vocab = {char: byte for byte, char in bytes_to_unicode().items()}
    for left, right in merges:
        vocab.setdefault(left + right, len(vocab))
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(specials)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token=eos_token,
        pad_token=pad_token,
        chat_template=chat_template,
    )
