"""GPT-2's byte-level table, which byte-level BPE tokenizers apply (the BPE preset's and
most hub models'): it lets the presets build one and a teacher of another tokenizer
map tokens back to bytes (`TokenBytes`), for the alignment of its logprobs and for the
trainer's next-byte distributions."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character table, which `ByteLevel` applies."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    table = {byte: chr(byte) for byte in printable}
    extra = 0
    for byte in range(256):
        if byte not in table:
            table[byte] = chr(256 + extra)
            extra += 1
    return table


BYTE_OF = {char: byte for byte, char in bytes_to_unicode().items()}
"""GPT-2's byte-level characters back to the bytes they stand for."""


class TokenBytes:
    """A tokenizer's tokens as the bytes of text they stand for. Added and special tokens
    are their literal text (so a student's stray `<|im_start|>` is text the teacher reads
    and judges). A byte-level BPE's other tokens are read from its vocabulary (exact, a
    partial UTF-8 character included); any other tokenizer's from the text each decoded
    prefix adds (a token that ends inside a character gets no bytes; the one that
    completes it, the character's)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.added = {index: token.encode() for token, index in tokenizer.get_added_vocab().items()}
        plain = {t: i for t, i in tokenizer.get_vocab().items() if i not in self.added}
        decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
        self.byte_level = type(decoder).__name__ == "ByteLevel" and all(
            char in BYTE_OF for token in plain for char in token
        )
        self.by_id: dict[int, bytes] = {}
        if self.byte_level:
            self.by_id = {i: bytes(BYTE_OF[char] for char in t) for t, i in plain.items()}
            self.by_id |= self.added
        self.extensible: frozenset[int] | None = None
        self.spelled: dict[int, bytes] = {}

    def piece(self, index: int) -> bytes:
        """One token's bytes alone (the top k's candidates); b"" for an id past the
        vocabulary (a model's padding rows)."""
        if self.byte_level:
            return self.by_id.get(index, b"")
        if index not in self.spelled:
            self.spelled[index] = self.pieces([index])[0] if index < len(self.tokenizer) else b""
        return self.spelled[index]

    def extendable(self, ids: Sequence[int]) -> list[bool]:
        """Whether each token is a proper prefix of another plain token of the vocabulary
        (`Run.soft`); the vocabulary is read once, each token decoded alone where it is
        not byte-level."""
        if self.extensible is None:
            plain = {i for i in self.tokenizer.get_vocab().values() if i not in self.added}
            spelled = {i: self.by_id[i] if self.byte_level else self.pieces([i])[0] for i in plain}
            prefixes = {b[:end] for b in spelled.values() for end in range(1, len(b))}
            self.extensible = frozenset(i for i, b in spelled.items() if b and b in prefixes)
        return [i in self.extensible for i in ids]

    def pieces(self, ids: Sequence[int]) -> list[bytes]:
        if self.byte_level:
            return [self.by_id[i] for i in ids]
        pieces: list[bytes] = []
        segment: list[int] = []  # plain tokens since the last added one
        done = b""
        for index in ids:
            if index in self.added:
                pieces.append(self.added[index])
                segment, done = [], b""
                continue
            segment.append(index)
            text = self.tokenizer.decode(segment, clean_up_tokenization_spaces=False)
            now = text.encode()
            if text.endswith("\ufffd") or not now.startswith(done):
                pieces.append(b"")  # inside a character: a later token completes it
                continue
            pieces.append(now[len(done) :])
            done = now
        return pieces

    def text(self, ids: Sequence[int]) -> str:
        """The text of `ids`, as the other side reads it."""
        return b"".join(self.pieces(ids)).decode("utf-8", errors="replace")
