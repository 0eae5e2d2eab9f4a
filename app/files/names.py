"""The names files are given: which an upload may have (no control characters, which
would break the header a download names it in), and that header (RFC 6266: an ASCII
fallback for old clients and the exact name, UTF-8 percent-encoded, for the rest)."""

from __future__ import annotations

import re
from urllib.parse import quote

MAX_FILENAME_CHARS = 255
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
"""C0 controls, DEL and C1 controls."""
NOT_PLAIN = re.compile(r'[^\x20-\x7e]|["\\]')
"""What a quoted ASCII filename cannot carry as it is."""
ATTR_CHARS = "!#$&+-.^_`|~"
"""Besides letters and digits, what RFC 8187's attr-char leaves unencoded."""


def control_character(filename: str) -> str | None:
    """The first control character in the name, as a code point (`U+000A`), or None."""
    found = CONTROL.search(filename)
    return None if found is None else f"U+{ord(found.group()):04X}"


def content_disposition(filename: str) -> str:
    """`attachment` with the name twice: `filename` in plain ASCII (each other character an
    underscore) and `filename*` exactly, so any name downloads, whatever it holds."""
    fallback = NOT_PLAIN.sub("_", filename)
    exact = quote(filename, safe=ATTR_CHARS)
    return f"attachment; filename=\"{fallback}\"; filename*=UTF-8''{exact}"
