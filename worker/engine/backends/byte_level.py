"""GPT-2's byte-level table, which byte-level BPE tokenizers apply (the BPE preset's and
most hub models'): it lets the presets build one and a teacher of another tokenizer
map tokens back to bytes."""

from __future__ import annotations


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
